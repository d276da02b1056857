// A run directory that a failed start created is removed again, so that a typo in a config does
// not leave runs/<name>/ behind, holding nothing but the lock file.
//
// Construct it before the directory is made; call locked() once this process holds the
// directory's lock (RunDirLock), and keep() once the run has started; destroy it before the
// lock, so that the lock file goes while it is locked. If the object is destroyed
// between the two (the Trainer's setup threw) and the directory did not exist when it was
// constructed, the lock file and the directory's empty subdirectories go, then the directory
// itself if it is empty, then each parent that did not exist either (runs/ on a first run) if it
// is empty. Anything else stays: only what is provably empty is removed, so nothing written
// there can be lost. Without the lock nothing goes: a run that started at the same moment and
// lost the race for the lock must not remove the winner's lock file and directories.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace mantissa::launcher {

class RunDirCleanup {
 public:
  RunDirCleanup(std::string run_dir, bool responsible);
  ~RunDirCleanup();
  RunDirCleanup(const RunDirCleanup&) = delete;
  RunDirCleanup& operator=(const RunDirCleanup&) = delete;

  void locked() { locked_ = true; }
  void keep() { kept_ = true; }

 private:
  std::string run_dir_;
  std::vector<std::filesystem::path> missing_parents_;  // deepest first
  bool created_here_;
  bool locked_ = false;
  bool kept_ = false;
};

}  // namespace mantissa::launcher
