#include "launcher/run_dir.h"

#include <filesystem>

#include "core/error.h"

namespace mantissa::launcher {

void require_run_directory(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto refuse = [&](const std::string& why) {
    throw core::ConfigError("--run " + run_dir + ": " + why);
  };
  if (!fs::is_directory(run_dir, ec)) {
    refuse(fs::exists(run_dir, ec) ? "is not a directory (--run takes a run.dir)"
                                   : "no such directory");
  }
  const fs::path config = run_config_file(run_dir);
  if (!fs::is_regular_file(config, ec)) {
    refuse(fs::exists(config, ec)
               ? "has a config.pbtxt that is not a regular file"
               : "has no config.pbtxt (not the run.dir of a `mantissa train` run?)");
  }
}

}  // namespace mantissa::launcher
