#include "launcher/checkpoints_writable.h"

#include <climits>
#include <filesystem>
#include <system_error>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_manifest.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/missing_directories.h"
#include "launcher/run_dir.h"

namespace mantissa::launcher {

void require_checkpoints_writable(const std::string& run_dir, int64_t last_step, int world_size) {
  namespace fs = std::filesystem;
  const std::string dir = run_checkpoints_dir(run_dir);
  const std::string what = "checkpoints (checked before the first step)";
  // The longest name a save makes, a rank's index in the step's temporary directory, is longer
  // than the probe below: a run.dir within a few bytes of PATH_MAX would pass the probe and fail
  // at the first save.
  const std::string longest = dir + "/" + checkpoint::checkpoint_dir_name(last_step) + ".tmp/" +
                              checkpoint::payload_file_name(world_size - 1) + ".index";
  if (longest.size() >= PATH_MAX) {
    throw core::ConfigError("run.dir = \"" + run_dir + "\": too long: a checkpoint's files would " +
                            "be named by paths of " + std::to_string(longest.size()) +
                            " bytes, past the system's limit of " + std::to_string(PATH_MAX - 1));
  }
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
