// One run per run directory at a time. Two runs writing one <run.dir> at once (the same command
// started twice, or two configs with the same run.dir) interleave their JSON-lines logs and
// rename checkpoints over each other; the second must not start.
//
// Rank 0 takes an exclusive flock(2) on <run.dir>/.lock for the whole run and writes its pid and
// host there, for the message a second run prints. The kernel drops the lock when the process
// ends, however it ends (a crash, kill -9, a preempted job), so a stale lock cannot keep the
// next run out; the file itself stays and is reused.
#pragma once

#include <string>

namespace mantissa::launcher {

// The lock file's name inside the run directory.
inline constexpr const char* kRunDirLockFile = ".lock";

class RunDirLock {
 public:
  // Throws core::ConfigError naming run.dir and the holder when another process holds the lock,
  // core::Error when the lock file cannot be opened.
  explicit RunDirLock(const std::string& run_dir);
  ~RunDirLock();
  RunDirLock(const RunDirLock&) = delete;
  RunDirLock& operator=(const RunDirLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace mantissa::launcher
