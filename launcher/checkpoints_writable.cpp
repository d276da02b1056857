#include "launcher/checkpoints_writable.h"

#include <filesystem>
#include <system_error>
#include <vector>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/missing_directories.h"
#include "launcher/run_dir.h"

namespace mantissa::launcher {

void require_checkpoints_writable(const std::string& run_dir) {
  namespace fs = std::filesystem;
  const std::string dir = run_checkpoints_dir(run_dir);
  const std::string what = "checkpoints (checked before the first step)";
  // What it makes it removes again: a start that fails later leaves run.dir as it was.
  const std::vector<fs::path> made = core::missing_directories(dir);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    core::throw_error_of_kind(
        core::path_error_kind(ec.value()),
        what + ": cannot create '" + dir + "': " + core::create_directories_failure(dir, ec));
  }
  try {
    core::require_can_create_files(what, dir);
  } catch (const core::Error&) {
    for (const fs::path& p : made) fs::remove(p, ec);
    throw;
  }
  for (const fs::path& p : made) fs::remove(p, ec);
}

}  // namespace mantissa::launcher
