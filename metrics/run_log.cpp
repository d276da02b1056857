#include "metrics/run_log.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/json_string.h"
#include "core/missing_directories.h"

namespace mantissa::metrics {

namespace {

// The steps whose median time the ETA counts with (odd: one middle step).
constexpr size_t kEtaWindow = 31;

// Shortest text that reads back as the same double, so logs compare bit for bit across runs
// (a resumed run against an uninterrupted one); JSON has no inf or NaN, so those are null.
void append_number(std::string& out, double value) {
  if (!std::isfinite(value)) {
    out += "null";
    return;
  }
  char buffer[32];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  out.append(buffer, end);
}

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  char buffer[32];
  if (s >= 3600) {
    std::snprintf(buffer, sizeof buffer, "%lldh%02lldm", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60));
  } else if (s >= 60) {
    std::snprintf(buffer, sizeof buffer, "%lldm%02llds", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  } else {
    std::snprintf(buffer, sizeof buffer, "%llds", static_cast<long long>(s));
  }
  return buffer;
}

std::string format_rate(double per_second) {
  char buffer[32];
  if (per_second >= 1e6) {
    std::snprintf(buffer, sizeof buffer, "%.2fM", per_second / 1e6);
  } else if (per_second >= 1e3) {
    std::snprintf(buffer, sizeof buffer, "%.1fk", per_second / 1e3);
  } else {
    std::snprintf(buffer, sizeof buffer, "%.0f", per_second);
  }
  return buffer;
}

// The step of a whole line of the log ({"step":N,...}), or -1 (a line cut short by a crash).
int64_t line_step(const std::string& line) {
  constexpr std::string_view kPrefix = "{\"step\":";
  if (!line.starts_with(kPrefix) || !line.ends_with('}')) return -1;
  int64_t step = -1;
  const char* begin = line.data() + kPrefix.size();
  const auto [end, error] = std::from_chars(begin, line.data() + line.size(), step);
  return error == std::errc() && *end == ',' ? step : -1;
}

// Appends `text` to `path` (created when missing), synced.
void append_synced(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (f == nullptr) {
    const int error = errno;  // permissions are the user's to fix (2), a full disk may pass (1)
    core::throw_error_of_kind(core::path_error_kind(error),
                              "cannot open '" + path + "': " + std::strerror(error));
  }
  const bool written = std::fwrite(text.data(), 1, text.size(), f) == text.size() &&
                       std::fflush(f) == 0 && ::fsync(fileno(f)) == 0;
  const int error = errno;
  std::fclose(f);
  MANTISSA_REQUIRE(written, kFailure, "cannot write '" << path << "': " << std::strerror(error));
}

// Where the part of a log that stays as it is ends, when the log is as every start leaves it:
// whole lines of rising steps below first_step, then only lines to move (steps first_step and
// later, a line cut short by a crash). Reads the log once, a line at a time. nullopt when an
// earlier step comes back later in the log (logs of versions before the rule), or the last
// line to keep lacks its newline (a crash between the two), which take the full rewrite.
std::optional<std::streamoff> end_of_kept_lines(const std::filesystem::path& path,
                                                int64_t first_step) {
  std::ifstream in(path, std::ios::binary);
  MANTISSA_REQUIRE(in, kFailure, "cannot read '" << path.string() << "': " << std::strerror(errno));
  std::streamoff kept_end = 0;
  int64_t previous_step = -1;
  bool in_kept_part = true;
  for (std::string line; std::getline(in, line);) {
    const int64_t step = line_step(line);
    const bool earlier = step >= 0 && step < first_step;
    if (in_kept_part && earlier && step > previous_step && !in.eof()) {
      previous_step = step;
      kept_end += static_cast<std::streamoff>(line.size()) + 1;
      continue;
    }
    in_kept_part = false;
    if (earlier) return std::nullopt;
  }
  MANTISSA_REQUIRE(!in.bad(), kFailure, "cannot read '" << path.string() << "'");
  return kept_end;
}

// Appends bytes [from, end) of `path` to `rolled_back` (ending them with a newline), a block at
// a time, synced.
void append_tail(const std::filesystem::path& path, std::streamoff from,
                 const std::filesystem::path& rolled_back) {
  std::ifstream in(path, std::ios::binary);
  in.seekg(from);
  MANTISSA_REQUIRE(in, kFailure, "cannot read '" << path.string() << "'");
  std::FILE* out = std::fopen(rolled_back.c_str(), "a");
  if (out == nullptr) {
    const int error = errno;
    core::throw_error_of_kind(core::path_error_kind(error), "cannot open '" + rolled_back.string() +
                                                                "': " + std::strerror(error));
  }
  std::vector<char> block(1 << 20);
  char last = '\n';
  bool written = true;
  while (written && in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto n = static_cast<size_t>(in.gcount());
    if (n > 0) last = block[n - 1];
    written = std::fwrite(block.data(), 1, n, out) == n;
  }
  const bool read = !in.bad();
  if (written && last != '\n') written = std::fputc('\n', out) != EOF;
  written = written && std::fflush(out) == 0 && ::fsync(fileno(out)) == 0;
  const int error = errno;
  std::fclose(out);
  MANTISSA_REQUIRE(read, kFailure, "cannot read '" << path.string() << "'");
  MANTISSA_REQUIRE(written, kFailure,
                   "cannot write '" << rolled_back.string() << "': " << std::strerror(error));
}

void truncate_file(const std::filesystem::path& path, std::streamoff size) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  const bool done = fd >= 0 && ::ftruncate(fd, size) == 0 && ::fsync(fd) == 0;
  const int error = errno;
  if (fd >= 0) ::close(fd);
  if (!done) {
    core::throw_error_of_kind(core::path_error_kind(error),
                              "cannot shorten '" + path.string() + "': " + std::strerror(error));
  }
}

// A log this process may not cut short (a directory in its place, another user's file, one made
// append-only or read-only) is refused before any of its lines moves: otherwise each retry
// would copy them to the rolled-back log again.
void require_writable_file(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    core::throw_error_of_kind(
        core::path_error_kind(error),
        "cannot open '" + path.string() + "' to write: " + std::strerror(error));
  }
  ::close(fd);
}

// Keeps in `log` the last line of each step before first_step and moves every other line
// (steps >= first_step, a step's earlier lines as logs before the rule have them, cut-short
// lines) to the end of `rolled_back`: appended and synced there first, then `log` cut short
// (the usual case: the lines to move are its tail) or replaced by what stays. A crash in
// between leaves a line in both, never in neither.
void move_redone_steps(const std::filesystem::path& log, const std::filesystem::path& rolled_back,
                       int64_t first_step) {
  // A log that is a symbolic link (to another file system, say) is rewritten where it points,
  // and stays a link: a rewrite at the link would put a file in its place.
  std::error_code ec;
  const std::filesystem::path path =
      std::filesystem::is_symlink(log, ec) && std::filesystem::exists(log, ec)
          ? std::filesystem::canonical(log)
          : log;
  // Of a rewrite below, by a start that was killed (beside the link too, by a start before
  // links were followed).
  core::remove_temporaries_of(path.string());
  if (path != log) core::remove_temporaries_of(log.string());
  if (!std::filesystem::exists(path, ec)) return;  // a new log
  if (std::filesystem::is_directory(path, ec)) {
    throw core::ConfigError("cannot open '" + path.string() + "': " + std::strerror(EISDIR));
  }
  const std::optional<std::streamoff> kept_end = end_of_kept_lines(path, first_step);
  if (kept_end && *kept_end == static_cast<std::streamoff>(std::filesystem::file_size(path))) {
    return;  // nothing to move
  }
  require_writable_file(path);
  if (kept_end) {
    append_tail(path, *kept_end, rolled_back);
    core::fsync_path(rolled_back.parent_path().string());  // its entry, when it is new
    truncate_file(path, *kept_end);
    return;
  }
  // The rewrite below replaces the log (which an append-only or another user's log refuses, as
  // the check above found) by a new file beside it.
  core::require_can_create_files("log", path.parent_path().string());
  std::ifstream in(path);
  std::vector<std::string> lines;
  std::unordered_map<int64_t, size_t> last_line_of_step;
  for (std::string line; std::getline(in, line);) {
    last_line_of_step[line_step(line)] = lines.size();
    lines.push_back(std::move(line));
  }
  MANTISSA_REQUIRE(!in.bad(), kFailure, "cannot read '" << path.string() << "'");
  std::string kept, moved;
  for (size_t i = 0; i < lines.size(); ++i) {
    const int64_t step = line_step(lines[i]);
    const bool keep = step >= 0 && step < first_step && last_line_of_step[step] == i;
    (keep ? kept : moved) += lines[i] + '\n';
  }
  if (!moved.empty()) {
    append_synced(rolled_back.string(), moved);
    core::fsync_path(rolled_back.parent_path().string());  // its entry, when it is new
  }
  core::write_file_atomically(path.string(), kept);
}

}  // namespace

double unix_time_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::vector<int> logged_ranks_beyond(const std::string& run_dir, int world_size) {
  const std::filesystem::path dir = std::filesystem::path(run_dir) / kStepLogDir;
  std::error_code ec;
  std::vector<int> ranks;
  for (const std::filesystem::directory_entry& entry :
       std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();  // rank<R>.jsonl
    if (!name.starts_with("rank") || !name.ends_with(".jsonl") || name.size() <= 10) continue;
    const std::string_view digits = std::string_view(name).substr(4, name.size() - 10);
    int r = 0;
    const auto [end, parsed] = std::from_chars(digits.data(), digits.data() + digits.size(), r);
    if (parsed == std::errc() && end == digits.data() + digits.size() && r >= world_size) {
      ranks.push_back(r);
    }
  }
  if (ec && ec != std::errc::no_such_file_or_directory) {
    core::throw_error_of_kind(core::path_error_kind(ec.value()),
                              "cannot list log directory '" + dir.string() +
                                  "': " + core::create_directories_failure(dir, ec));
  }
  std::sort(ranks.begin(), ranks.end());
  return ranks;
}

StepLog::StepLog(const std::string& run_dir, int rank, int world_size, int64_t first_step,
                 const std::vector<int>& ranks_beyond) {
  const std::filesystem::path dir = std::filesystem::path(run_dir) / kStepLogDir;
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    core::throw_error_of_kind(core::path_error_kind(ec.value()),
                              "cannot create log directory '" + dir.string() +
                                  "': " + core::create_directories_failure(dir, ec));
  }
  const auto log_of = [&](int r, const char* suffix) {
    return dir / ("rank" + std::to_string(r) + suffix);
  };
  // This rank's log, and those of an earlier attempt on more ranks that fall to it.
  move_redone_steps(log_of(rank, ".jsonl"), log_of(rank, ".rolled_back.jsonl"), first_step);
  for (const int r : ranks_beyond) {
    if (r % world_size == rank) {
      move_redone_steps(log_of(r, ".jsonl"), log_of(r, ".rolled_back.jsonl"), first_step);
    }
  }
  path_ = log_of(rank, ".jsonl").string();
  file_ = std::fopen(path_.c_str(), "a");
  if (file_ == nullptr) {
    const int error = errno;
    core::throw_error_of_kind(core::path_error_kind(error),
                              "cannot open log '" + path_ + "': " + std::strerror(error));
  }
}

StepLog::~StepLog() {
  std::fclose(file_);
}

void StepLog::sync() {
  MANTISSA_REQUIRE(std::fflush(file_) == 0 && ::fsync(fileno(file_)) == 0, kFailure,
                   "cannot write '" << path_ << "': " << std::strerror(errno));
}

void StepLog::write(const StepRecord& record) {
  const train::StepReport& r = record.report;
  const double now = unix_time_now();
  std::string line = "{\"step\":" + std::to_string(r.step);
  line += ",\"loss\":";
  append_number(line, r.loss);
  line += ",\"mean_loss\":";
  append_number(line, record.mean_loss);
  if (record.val_loss) {
    line += ",\"val_loss\":";
    append_number(line, *record.val_loss);
    line += ",\"eval_seconds\":";
    append_number(line, record.eval_seconds);
  }
  line += ",\"loss_scale\":";
  append_number(line, r.loss_scale);
  line += r.skipped ? ",\"overflow\":true" : ",\"overflow\":false";
  line += ",\"grad_norm\":";
  if (r.skipped) {
    line += "null";  // not computed: the gradients were not finite
  } else {
    append_number(line, r.grad_norm);
  }
  line += ",\"lr\":";
  append_number(line, r.lr);
  line += ",\"tokens\":" + std::to_string(r.tokens);
  line += ",\"epoch\":";
  append_number(line, record.epoch);
  line += ",\"tokens_per_s\":";
  append_number(line, record.tokens_per_s());
  line += ",\"step_seconds\":";
  append_number(line, record.step_seconds);
  line += ",\"allreduce_seconds\":";
  append_number(line, record.allreduce_seconds);
  line += ",\"allreduce_bytes\":" + std::to_string(record.allreduce_bytes);
  line += ",\"host_syncs\":" + std::to_string(record.host_syncs);
  line += ",\"time\":";
  append_number(line, now);
  if (!r.nonfinite_param.empty()) {
    line += ",\"skipped_param\":";
    line += core::json_quoted(r.nonfinite_param);
  }
  line += "}\n";
  MANTISSA_REQUIRE(std::fputs(line.c_str(), file_) >= 0 && std::fflush(file_) == 0, kFailure,
                   "cannot write log '" << path_ << "': " << std::strerror(errno));
}

ProgressLine::ProgressLine(ProgressMode mode, int64_t total_steps, int64_t log_every,
                           std::FILE* out, RecurringWork recurring)
    : live_(mode == ProgressMode::kLive ||
            (mode == ProgressMode::kAuto && isatty(fileno(out)) == 1)),
      total_steps_(total_steps),
      log_every_(log_every),
      out_(out),
      recurring_(recurring) {}

namespace {

// How many times work recurring after every `every` steps (0: only after the last) runs after
// step `done` up to the run's end at `total`, the last step's included.
int64_t occurrences_after(int64_t done, int64_t total, int64_t every) {
  if (done >= total) return 0;
  if (every <= 0) return 1;
  return total / every - done / every + (total % every != 0 ? 1 : 0);
}

}  // namespace

double ProgressLine::eta_seconds(double step_seconds, int64_t done) const {
  const auto mean = [](double total, int64_t count) {
    return count > 0 ? total / static_cast<double>(count) : 0.0;
  };
  return step_seconds * static_cast<double>(total_steps_ - done) +
         mean(eval_seconds_, evals_seen_) *
             static_cast<double>(occurrences_after(done, total_steps_, recurring_.eval_every)) +
         mean(checkpoint_seconds_, checkpoints_seen_) *
             static_cast<double>(
                 occurrences_after(done, total_steps_, recurring_.checkpoint_every));
}

void ProgressLine::update(const StepRecord& record, int world_size) {
  const train::StepReport& r = record.report;
  // The ETA counts the remaining steps at the median time of the last kEtaWindow: a stall (a
  // slow file system, a peer's checkpoint) or the first step's warm-up does not move it, as it
  // moved a running mean (one 60 s stall among 0.4 s steps multiplied it by 16 for dozens of
  // steps), while a lasting change of speed shows within half the window. To that it adds the
  // evaluations and checkpoints still to come, each at the mean time of those this process ran
  // (an ETA without them came short by their share of the run). Counted, not spread over the
  // steps run: a resumed process's first save may come after fewer steps than the interval.
  // The rate shown is the same median's, so that one slow step does not make it jump either.
  recent_step_seconds_.push_back(record.step_seconds);
  if (record.val_loss) {
    eval_seconds_ += record.eval_seconds;
    ++evals_seen_;
  }
  if (recent_step_seconds_.size() > kEtaWindow) recent_step_seconds_.pop_front();
  std::vector<double> sorted(recent_step_seconds_.begin(), recent_step_seconds_.end());
  // The lower median: of two steps, the faster (the first includes the warm-up).
  const auto middle = sorted.begin() + static_cast<std::ptrdiff_t>((sorted.size() - 1) / 2);
  std::nth_element(sorted.begin(), middle, sorted.end());
  const int64_t done = r.step + 1;
  // The first step this process runs, which includes the warm-up, shows its time alone: as a
  // pace it made the ETA of a resumed run 10x too long.
  const bool first = recent_step_seconds_.size() == 1;
  char pace[64];
  if (first && record.step_seconds >= 60) {
    std::snprintf(pace, sizeof pace, "first step %s", format_duration(record.step_seconds).c_str());
  } else if (first) {
    std::snprintf(pace, sizeof pace, "first step %.3g s", record.step_seconds);
  } else {
    std::snprintf(pace, sizeof pace, "%s tok/s | ETA %s",
                  format_rate(static_cast<double>(r.tokens) * world_size / *middle).c_str(),
                  format_duration(eta_seconds(*middle, done)).c_str());
  }
  char line[256];
  std::snprintf(line, sizeof line, "step %lld/%lld | loss %.4f | scale %g | lr %.2e | %s",
                static_cast<long long>(done), static_cast<long long>(total_steps_),
                record.mean_loss, static_cast<double>(r.loss_scale), r.lr, pace);
  std::string text = line;
  if (record.val_loss) {
    std::snprintf(line, sizeof line, " | val loss %.4f", *record.val_loss);
    text += line;
  }
  if (r.skipped) {
    text += " | skipped: non-finite gradients";
    if (!r.nonfinite_param.empty()) text += " (first in " + r.nonfinite_param + ")";
  }
  // The first step this process runs shows at once, also after a resume.
  const bool keep = done % log_every_ == 0 || first || done == total_steps_ || r.skipped ||
                    record.val_loss.has_value();
  if (live_) {
    // \033[K clears what a longer previous line left on the right.
    std::fprintf(out_, "\r%s\033[K%s", text.c_str(), keep ? "\n" : "");
    line_open_ = !keep;
  } else if (keep) {
    std::fprintf(out_, "%s\n", text.c_str());
  }
  std::fflush(out_);
}

void ProgressLine::note(const std::string& text) {
  finish();
  std::fprintf(out_, "%s\n", text.c_str());
  std::fflush(out_);
}

void ProgressLine::finish() {
  if (line_open_) std::fputc('\n', out_);
  line_open_ = false;
  std::fflush(out_);
}

}  // namespace mantissa::metrics
