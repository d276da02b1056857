#include "launcher/run_dir_cleanup.h"

#include <filesystem>
#include <system_error>

#include "core/missing_directories.h"
#include "launcher/run_dir.h"
#include "launcher/run_dir_lock.h"
#include "metrics/run_log.h"

namespace mantissa::launcher {

namespace fs = std::filesystem;

RunDirCleanup::RunDirCleanup(std::string run_dir, bool responsible) : run_dir_(std::move(run_dir)) {
  std::error_code ec;
  created_here_ = responsible && !fs::exists(run_dir_, ec) && !ec;
  if (created_here_) missing_parents_ = core::missing_directories(fs::path(run_dir_).parent_path());
}

RunDirCleanup::~RunDirCleanup() {
  if (!created_here_ || !locked_ || kept_) return;
  // fs::remove takes a file or an empty directory and fails (quietly, through ec) on anything
  // else, so a directory that holds something stays.
  std::error_code ec;
  fs::remove(fs::path(run_dir_) / kRunDirLockFile, ec);
  fs::remove(run_checkpoints_dir(run_dir_), ec);
  fs::remove(fs::path(run_dir_) / metrics::kStepLogDir, ec);
  fs::remove(run_dir_, ec);
  for (const fs::path& parent : missing_parents_) fs::remove(parent, ec);
}

}  // namespace mantissa::launcher
