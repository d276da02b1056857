// A run directory that a failed start created is removed again, so that a typo in a config does
// not leave runs/<name>/ behind, holding nothing but the lock file.
//
// Construct it before the directory is made; call keep() once the run has started. If the
// object is destroyed before that (the Trainer's setup threw) and the directory did not exist
// when it was constructed, the lock file and the directory's empty subdirectories go, then the
// directory itself if it is empty, then each parent that did not exist either (runs/ on a first
// run) if it is empty. Anything else stays: only what is provably empty is removed, so nothing
// written there can be lost.
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

  void keep() { remove_on_failure_ = false; }

 private:
  std::string run_dir_;
  std::vector<std::filesystem::path> missing_parents_;  // deepest first
  bool remove_on_failure_;
};

}  // namespace mantissa::launcher
