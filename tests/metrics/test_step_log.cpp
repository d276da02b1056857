// The step log's one-line-per-step rule at a start: which lines stay in rank<R>.jsonl and which
// move, in order, to rank<R>.rolled_back.jsonl; and the progress line's ETA (metrics/run_log.h).
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/error.h"
#include "metrics/run_log.h"
#include "tests/common/scratch_dir.h"

namespace mantissa::metrics {
namespace {

namespace fs = std::filesystem;

class StepLogStart : public ::testing::Test {
 protected:
  StepLogStart() { fs::create_directories(dir_.file("log")); }

  void write(const std::string& name, const std::vector<std::string>& lines) {
    std::ofstream out(dir_.file("log/" + name));
    for (const std::string& line : lines) out << line << "\n";
  }
  std::vector<std::string> read(const std::string& name) {
    std::ifstream in(dir_.file("log/" + name));
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }
  std::string run_dir() const { return dir_.path(); }

 private:
  tests::ScratchDir dir_{"mantissa_step_log"};
};

std::string line(int step, const char* tag) {
  return "{\"step\":" + std::to_string(step) + ",\"attempt\":\"" + tag + "\"}";
}

TEST_F(StepLogStart, KeepsTheLastLineOfEachEarlierStepAndMovesTheRestInOrder) {
  // An attempt that reached step 3 and a cut-short line, steps 1 and 2 logged twice (as logs
  // before the rule have them), and a start at step 3.
  const std::string cut = "{\"step\":4,\"lo";
  write("rank0.jsonl",
        {line(0, "a"), line(1, "a"), line(2, "a"), line(1, "b"), line(2, "b"), line(3, "b"), cut});
  write("rank0.rolled_back.jsonl", {line(9, "older")});
  { StepLog log(run_dir(), 0, 1, 3, logged_ranks_beyond(run_dir(), 1)); }
  EXPECT_EQ(read("rank0.jsonl"),
            (std::vector<std::string>{line(0, "a"), line(1, "b"), line(2, "b")}));
  EXPECT_EQ(
      read("rank0.rolled_back.jsonl"),
      (std::vector<std::string>{line(9, "older"), line(1, "a"), line(2, "a"), line(3, "b"), cut}));
}

// A directory where the log goes is refused before anything moves, as a config error (exit 2)
// naming it and why.
TEST_F(StepLogStart, ADirectoryInTheLogsPlaceIsRefusedNamingIt) {
  fs::create_directories(run_dir() + "/log/rank0.jsonl");
  try {
    StepLog log(run_dir(), 0, 1, 3, logged_ranks_beyond(run_dir(), 1));
    FAIL() << "a directory was taken for the log";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open '" + run_dir() +
                                         "/log/rank0.jsonl': Is a directory"),
              std::string::npos)
        << e.what();
  }
  EXPECT_FALSE(fs::exists(run_dir() + "/log/rank0.rolled_back.jsonl"));
}

// A file where the log directory goes is named as such when the logs are listed.
TEST(StepLogDirectory, AFileInItsPlaceIsNamed) {
  const tests::ScratchDir dir("mantissa_step_log_dir");
  std::ofstream(dir.file("log")) << "x";
  try {
    logged_ranks_beyond(dir.path(), 1);
    FAIL() << "a file was listed as the log directory";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot list log directory '" + dir.file("log") + "': '" +
                                         dir.file("log") + "' is a file, not a directory"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(StepLogStart, AFreshStartMovesEverything) {
  write("rank0.jsonl", {line(0, "a"), line(1, "a")});
  { StepLog log(run_dir(), 0, 1, 0, logged_ranks_beyond(run_dir(), 1)); }
  EXPECT_EQ(read("rank0.jsonl"), std::vector<std::string>{});
  EXPECT_EQ(read("rank0.rolled_back.jsonl"),
            (std::vector<std::string>{line(0, "a"), line(1, "a")}));
}

TEST_F(StepLogStart, TheTemporaryOfARewriteThatWasKilledGoes) {
  // A start killed while it replaced rank0.jsonl left its temporary file; the next start
  // removes it and leaves other files of the directory alone.
  write("rank0.jsonl", {line(0, "a")});
  write("rank0.jsonl.4242-0.tmp", {line(0, "a")});
  write("rank0.jsonl.notes", {"kept"});
  { StepLog log(run_dir(), 0, 1, 1, logged_ranks_beyond(run_dir(), 1)); }
  EXPECT_FALSE(fs::exists(fs::path(run_dir()) / "log/rank0.jsonl.4242-0.tmp"));
  EXPECT_EQ(read("rank0.jsonl.notes"), std::vector<std::string>{"kept"});
  EXPECT_EQ(read("rank0.jsonl"), std::vector<std::string>{line(0, "a")});
}

// A log kept elsewhere through a symbolic link is rewritten there, and the link stays.
TEST_F(StepLogStart, ALinkedLogIsRewrittenWhereItPointsAndStaysALink) {
  const tests::ScratchDir elsewhere("mantissa_step_log_elsewhere");
  {
    std::ofstream out(elsewhere.file("rank0.jsonl"));
    // Step 1 logged twice, before the one-line rule: no tail to cut, a rewrite.
    for (const std::string& l : {line(0, "a"), line(1, "a"), line(1, "b"), line(2, "b")}) {
      out << l << "\n";
    }
  }
  const fs::path link = fs::path(run_dir()) / "log" / "rank0.jsonl";
  fs::create_symlink(elsewhere.file("rank0.jsonl"), link);
  { StepLog log(run_dir(), 0, 1, 2, logged_ranks_beyond(run_dir(), 1)); }
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(read("rank0.jsonl"), (std::vector<std::string>{line(0, "a"), line(1, "b")}));
  EXPECT_EQ(read("rank0.rolled_back.jsonl"),
            (std::vector<std::string>{line(1, "a"), line(2, "b")}));
}

TEST_F(StepLogStart, AResumeCutsTheRedoneStepsOffTheSameFile) {
  // The usual resume: rising steps, then the steps after the checkpoint and a line cut short
  // without its newline. The log is shortened in place (a `tail -f` keeps following it), not
  // rewritten; the moved lines end with a newline.
  const std::string cut = "{\"step\":3,\"lo";
  {
    std::ofstream out(fs::path(run_dir()) / "log" / "rank0.jsonl");
    out << line(0, "a") << "\n" << line(1, "a") << "\n" << line(2, "a") << "\n" << cut;
  }
  const auto inode = [&] {
    struct stat status {};
    EXPECT_EQ(::stat((fs::path(run_dir()) / "log" / "rank0.jsonl").c_str(), &status), 0);
    return status.st_ino;
  };
  const ino_t before = inode();
  { StepLog log(run_dir(), 0, 1, 1, logged_ranks_beyond(run_dir(), 1)); }
  EXPECT_EQ(inode(), before);
  EXPECT_EQ(read("rank0.jsonl"), std::vector<std::string>{line(0, "a")});
  EXPECT_EQ(read("rank0.rolled_back.jsonl"),
            (std::vector<std::string>{line(1, "a"), line(2, "a"), cut}));
}

TEST_F(StepLogStart, AWholeLastLineWithoutItsNewlineStaysALineOfItsOwn) {
  // A crash between a line's closing brace and its newline: the step stays, and the next
  // step's line starts on a line of its own.
  {
    std::ofstream out(fs::path(run_dir()) / "log" / "rank0.jsonl");
    out << line(0, "a") << "\n" << line(1, "a");
  }
  {
    StepLog log(run_dir(), 0, 1, 2, logged_ranks_beyond(run_dir(), 1));
    StepRecord record;
    record.report.step = 2;
    log.write(record);
  }
  const std::vector<std::string> lines = read("rank0.jsonl");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], line(1, "a"));
  EXPECT_TRUE(lines[2].starts_with("{\"step\":2,")) << lines[2];
}

TEST_F(StepLogStart, LogsOfRanksBeyondTheWorldAreRolledBackToo) {
  // An attempt on 3 ranks, resumed on 2: rank 0 also takes rank 2's log, rank 1 its own only.
  for (const char* name : {"rank0.jsonl", "rank1.jsonl", "rank2.jsonl"}) {
    write(name, {line(0, "a"), line(1, "a"), line(2, "a")});
  }
  { StepLog log(run_dir(), 0, 2, 1, logged_ranks_beyond(run_dir(), 2)); }
  EXPECT_EQ(read("rank0.jsonl"), std::vector<std::string>{line(0, "a")});
  EXPECT_EQ(read("rank2.jsonl"), std::vector<std::string>{line(0, "a")});
  EXPECT_EQ(read("rank2.rolled_back.jsonl"),
            (std::vector<std::string>{line(1, "a"), line(2, "a")}));
  EXPECT_EQ(read("rank1.jsonl").size(), 3u) << "rank 1's log is rank 1's to move";
}

TEST_F(StepLogStart, LogsOfRanksBeyondAGapAreRolledBackToo) {
  // An attempt on 6 ranks whose rank 2 never wrote its log, resumed on 2: rank 0 takes rank 4's.
  for (const char* name : {"rank0.jsonl", "rank1.jsonl", "rank3.jsonl", "rank4.jsonl"}) {
    write(name, {line(0, "a"), line(1, "a")});
  }
  write("rank4.rolled_back.jsonl", {line(5, "old")});
  { StepLog log(run_dir(), 0, 2, 1, logged_ranks_beyond(run_dir(), 2)); }
  EXPECT_EQ(read("rank4.jsonl"), std::vector<std::string>{line(0, "a")});
  EXPECT_EQ(read("rank4.rolled_back.jsonl"),
            (std::vector<std::string>{line(5, "old"), line(1, "a")}));
  EXPECT_EQ(read("rank3.jsonl").size(), 2u) << "rank 3's log is rank 1's to move";
  EXPECT_FALSE(fs::exists(run_dir() + "/log/rank2.jsonl"));
}

TEST_F(StepLogStart, LoggedRanksBeyondTheWorldCountStepLogsOnly) {
  EXPECT_EQ(logged_ranks_beyond(run_dir(), 2), std::vector<int>{}) << "no log directory yet";
  for (const char* name : {"rank0.jsonl", "rank7.jsonl", "rank3.jsonl", "rank12.rolled_back.jsonl",
                           "rank9.jsonl.tmp", "ranks.jsonl", "notes.jsonl"}) {
    write(name, {line(0, "a")});
  }
  EXPECT_EQ(logged_ranks_beyond(run_dir(), 2), (std::vector<int>{3, 7}));
  EXPECT_EQ(logged_ranks_beyond(run_dir(), 8), std::vector<int>{});
}

// Time outside a step's step_seconds: its evaluation, and what follows it (a checkpoint save).
struct AfterStep {
  double eval_seconds = 0;
  double checkpoint_seconds = 0;
};

// The progress lines after each of `seconds` (steps of 1000, of 1024 tokens, the first
// `first_step`, with an evaluation scheduled every 10 steps and a checkpoint every 100), one
// line a step; `after` gives some steps (by index) an evaluation or a save.
std::vector<std::string> progress_lines(const std::vector<double>& seconds,
                                        const std::map<size_t, AfterStep>& after = {},
                                        int64_t first_step = 0) {
  std::FILE* out = std::tmpfile();
  ProgressLine progress(ProgressMode::kLines, 1000, 1, out,
                        {.eval_every = 10, .checkpoint_every = 100});
  for (size_t i = 0; i < seconds.size(); ++i) {
    const auto extra = after.find(i);
    StepRecord record;
    record.report.step = first_step + static_cast<int64_t>(i);
    record.report.tokens = 1024;
    record.step_seconds = seconds[i];
    if (extra != after.end() && extra->second.eval_seconds > 0) {
      record.val_loss = 3.0;
      record.eval_seconds = extra->second.eval_seconds;
    }
    progress.update(record, 1);
    if (extra != after.end() && extra->second.checkpoint_seconds > 0) {
      progress.add_checkpoint_seconds(extra->second.checkpoint_seconds);
    }
  }
  std::rewind(out);
  std::vector<std::string> lines;
  for (char line[512]; std::fgets(line, sizeof line, out);) lines.push_back(line);
  std::fclose(out);
  return lines;
}

// The ETA of each progress line.
std::vector<std::string> etas(const std::vector<double>& seconds,
                              const std::map<size_t, AfterStep>& after = {},
                              int64_t first_step = 0) {
  std::vector<std::string> found;
  for (const std::string& text : progress_lines(seconds, after, first_step)) {
    const size_t at = text.find("ETA ");
    const size_t end = std::min(text.find('\n', at), text.find(" |", at));
    found.push_back(at == std::string::npos ? "" : text.substr(at + 4, end - at - 4));
  }
  return found;
}

// The tokens per second of each progress line ("1.0k").
std::vector<std::string> rates(const std::vector<double>& seconds) {
  std::vector<std::string> found;
  for (const std::string& text : progress_lines(seconds)) {
    const size_t end = text.find(" tok/s");
    const size_t at = text.rfind("| ", end) + 2;
    found.push_back(end == std::string::npos ? "" : text.substr(at, end - at));
  }
  return found;
}

TEST(ProgressLine, OneStallDoesNotMoveTheEtaALastingChangeOfSpeedDoes) {
  std::vector<double> seconds(10, 1.0);
  seconds.push_back(100.0);                // step 11 stalls
  seconds.insert(seconds.end(), 20, 2.0);  // then the steps take twice as long
  const std::vector<std::string> eta = etas(seconds);
  ASSERT_EQ(eta.size(), seconds.size());
  EXPECT_EQ(eta[9], "16m30s");   // 990 steps of 1 s
  EXPECT_EQ(eta[10], "16m29s");  // the stall: still 1 s a step
  EXPECT_EQ(eta[30], "32m18s");  // 969 steps of 2 s, the new speed the median of the window
  // The first step's warm-up is not the pace either: of two steps, the faster counts; the
  // first shows its time alone.
  EXPECT_EQ(etas({100.0, 1.0})[1], "16m38s");  // 998 steps of 1 s
  const std::vector<std::string> lines = progress_lines({100.0, 1.0});
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_TRUE(lines[0].ends_with("| lr 0.00e+00 | first step 1m40s\n")) << lines[0];
  EXPECT_EQ(lines[0].find("ETA"), std::string::npos) << lines[0];
  EXPECT_TRUE(progress_lines({1234.0})[0].ends_with("| first step 20m34s\n"));
  EXPECT_TRUE(progress_lines({2.5})[0].ends_with("| first step 2.5 s\n"));
}

// The rate beside the ETA is the same median's: one slow step does not make it jump.
TEST(ProgressLine, OneStallDoesNotMoveTheRateALastingChangeOfSpeedDoes) {
  std::vector<double> seconds(10, 0.5);
  seconds.push_back(50.0);                 // step 11 stalls
  seconds.insert(seconds.end(), 20, 1.0);  // then the steps take twice as long
  const std::vector<std::string> rate = rates(seconds);
  ASSERT_EQ(rate.size(), seconds.size());
  EXPECT_EQ(rate[9], "2.0k");   // 1024 tokens in 0.5 s
  EXPECT_EQ(rate[10], "2.0k");  // the stall
  EXPECT_EQ(rate[30], "1.0k");
}

// Evaluations and checkpoints recur: the ETA adds those still to come, each at the mean time of
// those run so far. Steps of 1 s, an evaluation of 4 s after step 10, a checkpoint of 6 s after
// step 100 (of 1000; evaluations every 10 steps, checkpoints every 100).
TEST(ProgressLine, TheEtaCountsEvaluationsAndCheckpoints) {
  const std::vector<std::string> eta =
      etas(std::vector<double>(101, 1.0),
           {{9, {.eval_seconds = 4.0}}, {99, {.checkpoint_seconds = 6.0}}});
  ASSERT_EQ(eta.size(), 101u);
  EXPECT_EQ(eta[8], "16m31s");    // 991 steps of 1 s
  EXPECT_EQ(eta[9], "23m06s");    // 990 steps of 1 s + 99 evaluations of 4 s
  EXPECT_EQ(eta[100], "21m53s");  // 899 s + 90 evaluations of 4 s + 9 checkpoints of 6 s
}

// A process resumed at step 550 (a checkpoint written when a signal stopped the run) saves
// first at step 600, 50 steps in: spread over the steps it ran, that save made the ETA count
// 6 s per 51 steps (7m26s); counted, the 4 saves still to come add 24 s.
TEST(ProgressLine, TheEtaAfterAResumeCountsTheSavesToCome) {
  const std::vector<std::string> eta =
      etas(std::vector<double>(51, 1.0), {{49, {.checkpoint_seconds = 6.0}}}, 550);
  ASSERT_EQ(eta.size(), 51u);
  EXPECT_EQ(eta[50], "7m03s");  // 399 steps of 1 s + 4 checkpoints of 6 s
}

// A run resumed at step 10 with log_every 5 shows its first step (11) at once: a requeued job
// stayed silent until the next multiple of log_every (maybe 100 slow steps).
TEST(ProgressLine, TheFirstStepOfAResumeShows) {
  std::FILE* out = std::tmpfile();
  ProgressLine progress(ProgressMode::kLines, 100, 5, out);
  for (int64_t step = 10; step < 16; ++step) {
    StepRecord record;
    record.report.step = step;
    record.step_seconds = 1.0;
    progress.update(record, 1);
  }
  std::rewind(out);
  std::vector<std::string> shown;
  for (char line[512]; std::fgets(line, sizeof line, out);)
    shown.push_back(std::string(line).substr(0, std::string(line).find(" |")));
  std::fclose(out);
  EXPECT_EQ(shown, (std::vector<std::string>{"step 11/100", "step 15/100"}));
}

}  // namespace
}  // namespace mantissa::metrics
