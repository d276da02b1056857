// core::write_file_atomically: the file holds its old or its new content, never a part, and
// nothing beside it (a user's file, a link) is touched.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "core/durable_file.h"
#include "core/error.h"
#include "tests/common/scratch_dir.h"

namespace mantissa::core {
namespace {

namespace fs = std::filesystem;

class WriteFileAtomically : public ::testing::Test {
 protected:
  std::string path(const char* name) const { return dir_.file(name); }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  tests::ScratchDir dir_{"mantissa_durable"};
};

TEST_F(WriteFileAtomically, ReplacesTheContent) {
  write_file_atomically(path("config.pbtxt"), "old\n");
  write_file_atomically(path("config.pbtxt"), "new\n");
  EXPECT_EQ(read(path("config.pbtxt")), "new\n");
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(fs::path(path("config.pbtxt")).parent_path()))
    names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"config.pbtxt"}) << "no temporary file left";
}

TEST_F(WriteFileAtomically, AnUnfinishedDurableFileIsRemoved) {
  {
    DurableFile kept(path("kept"));
    kept.write("abc", 3);
    kept.finish();
    DurableFile dropped(path("dropped"));
    dropped.write("abc", 3);  // an error unwinds past it before finish()
  }
  EXPECT_EQ(read(path("kept")), "abc");
  EXPECT_FALSE(fs::exists(path("dropped")));
}

// What lies beside the file is not the writer's: a user's PATH.tmp, and links where the next
// temporary names would go (a link would have been written through, as root, to its target).
TEST_F(WriteFileAtomically, FilesAndLinksBesideItAreLeftAlone) {
  std::ofstream(path("tok.model.tmp")) << "mine";
  std::ofstream(path("target")) << "precious";
  const std::string probe = DurableFile::temporary_beside(path("tok.model")).path();
  // "<path>.<pid>-<n>.tmp": the next numbers follow n.
  const size_t dash = probe.rfind('-');
  const int n = std::stoi(probe.substr(dash + 1));
  for (int k = n + 1; k <= n + 3; ++k) {
    fs::create_symlink(path("target"), probe.substr(0, dash + 1) + std::to_string(k) + ".tmp");
  }
  write_file_atomically(path("tok.model"), "model");
  EXPECT_EQ(read(path("tok.model")), "model");
  EXPECT_EQ(read(path("tok.model.tmp")), "mine");
  EXPECT_EQ(read(path("target")), "precious");
  // A DurableFile refuses a link at its own path too.
  try {
    DurableFile through(probe.substr(0, dash + 1) + std::to_string(n + 1) + ".tmp");
    FAIL() << "opened a link";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Too many levels of symbolic links"), std::string::npos)
        << e.what();
  }
  EXPECT_EQ(read(path("target")), "precious");
}

TEST(TemporaryNames, AreTheTargetsDotPidDashNumberDotTmp) {
  const std::string probe = DurableFile::temporary_beside("/tmp/mantissa-name-probe").path();
  std::filesystem::remove(probe);
  EXPECT_TRUE(is_temporary_of(fs::path(probe).filename().string(), "mantissa-name-probe"));
  EXPECT_TRUE(is_temporary_of("latest.12-0.tmp", "latest"));
  for (const char* other : {"latest", "latest.tmp", "latest.12.tmp", "latest.-0.tmp",
                            "latest.12-.tmp", "latest.1x-0.tmp", "latest.12-0.tmp.x",
                            "latest2.12-0.tmp", "latest.12-0-1.tmp", ".12-0.tmp"}) {
    EXPECT_FALSE(is_temporary_of(other, "latest")) << other;
  }
}

// AtPath::kKeep: what appears at the path while the content is written (another writer's
// file, a user's, a dangling link) stays, and the call says so (a config error, exit 2);
// nothing there, the file is published as with kReplace.
TEST_F(WriteFileAtomically, KeepLeavesWhatAppearedMeanwhile) {
  const std::string out = path("out.safetensors");
  write_file_atomically(out, "first", AtPath::kKeep);
  EXPECT_EQ(read(out), "first");
  const auto appearing = [&](const std::function<void()>& appear) {
    try {
      write_file_atomically(
          out,
          [&](DurableFile& file) {
            appear();
            file.write("mine", 4);
          },
          AtPath::kKeep);
      ADD_FAILURE() << "replaced what appeared at " << out;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("'" + out + "' appeared while it was being written"),
                std::string::npos)
          << e.what();
    }
  };
  fs::remove(out);
  appearing([&] { std::ofstream(out) << "theirs"; });
  EXPECT_EQ(read(out), "theirs");
  fs::remove(out);
  appearing([&] { fs::create_symlink(path("nowhere"), out); });
  EXPECT_TRUE(fs::is_symlink(out));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(fs::path(out).parent_path()))
    names.push_back(entry.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"out.safetensors"}) << "no temporary file left";
}

TEST_F(WriteFileAtomically, TemporariesLeftByACrashAreRemovedOnRequest) {
  for (const char* name : {"config.pbtxt.41-0.tmp", "config.pbtxt.41-7.tmp", "config.pbtxt.tmp",
                           "config.pbtxt", "other.41-0.tmp"}) {
    std::ofstream(path(name)) << name;
  }
  remove_temporaries_of(path("config.pbtxt"));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(fs::path(path("config.pbtxt")).parent_path()))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names,
            (std::vector<std::string>{"config.pbtxt", "config.pbtxt.tmp", "other.41-0.tmp"}));
}

// A user's --out: only the temporaries of writers that no longer run here go. A child that
// has exited (and been waited for) stands for a killed export.
TEST_F(WriteFileAtomically, OrphanedTemporariesGoThoseOfRunningWritersStay) {
  const pid_t child = fork();
  if (child == 0) _exit(0);
  ASSERT_GT(child, 0);
  ASSERT_EQ(waitpid(child, nullptr, 0), child);
  const std::string running = "w.safetensors." + std::to_string(getpid()) + "-0.tmp";
  const std::string ended = "w.safetensors." + std::to_string(child) + "-3.tmp";
  for (const std::string& name :
       {running, ended, std::string("w.safetensors.99999999999-0.tmp"),
        std::string("w.safetensors"),
        std::string("v.safetensors.") + std::to_string(child) + "-0.tmp"}) {
    std::ofstream(path(name.c_str())) << name;
  }
  remove_orphaned_temporaries_of(path("w.safetensors"));
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(fs::path(path("w.safetensors")).parent_path()))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  std::vector<std::string> expected = {"v.safetensors." + std::to_string(child) + "-0.tmp",
                                       "w.safetensors", running};
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(names, expected);
}

TEST_F(WriteFileAtomically, AFailedWriteLeavesTheOldContentAndSaysWhy) {
  // A file size limit (RLIMIT_FSIZE; SIGXFSZ ignored) fails the write with EFBIG, as a full
  // disk fails it with ENOSPC.
  write_file_atomically(path("config.pbtxt"), "old\n");
  rlimit saved{};
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  const auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
  rlimit limited = saved;
  limited.rlim_cur = 4096;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  std::string message;
  try {
    write_file_atomically(path("config.pbtxt"), std::string(8192, 'x'));
  } catch (const Error& e) {
    message = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::kFailure);
  }
  setrlimit(RLIMIT_FSIZE, &saved);
  std::signal(SIGXFSZ, old_handler);
  EXPECT_TRUE(message.starts_with("cannot write '" + path("config.pbtxt") + "."));
  EXPECT_TRUE(message.ends_with(".tmp': File too large")) << message;
  EXPECT_EQ(read(path("config.pbtxt")), "old\n");
  int files = 0;
  for ([[maybe_unused]] const auto& entry :
       fs::directory_iterator(fs::path(path("config.pbtxt")).parent_path()))
    ++files;
  EXPECT_EQ(files, 1) << "the temporary file is removed";
}

}  // namespace
}  // namespace mantissa::core
