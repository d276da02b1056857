// The layout of a run directory (run.dir), named once: what `mantissa train` writes there and
// `export`, `sample` and a failed start's cleanup read. (Its log/ is metrics/run_log.h's, its
// .lock run_dir_lock.h's.)
#pragma once

#include <string>

namespace mantissa::launcher {

// The checkpoints (checkpoint/checkpoint.h: step_<8 digits>/ and `latest`).
inline std::string run_checkpoints_dir(const std::string& run_dir) {
  return run_dir + "/checkpoints";
}

// The effective config of the steps trained there, in text format.
inline std::string run_config_file(const std::string& run_dir) {
  return run_dir + "/config.pbtxt";
}

// Throws core::ConfigError, as `--run DIR: why`, unless `run_dir` is a directory holding a
// config.pbtxt (export --run and sample --run read it).
void require_run_directory(const std::string& run_dir);

}  // namespace mantissa::launcher
