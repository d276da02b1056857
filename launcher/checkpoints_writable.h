// A run whose checkpoints cannot be saved would find out at its first save, after up to
// checkpoint.every_steps steps of work (all of a run's, when it saves only at its end). Rank 0,
// which makes the save's directories, checks before the first step that it can.
#pragma once

#include <cstdint>
#include <string>

namespace mantissa::launcher {

// Makes a file in <run_dir>/checkpoints (and that directory, when missing) and removes both
// again (core::require_can_create_files), and checks that the longest path a save of a step up
// to `last_step` by `world_size` ranks makes fits PATH_MAX. Throws core::Error naming the
// directory and the reason, exit 2 for permissions, a read-only file system or a run.dir too
// long. Call it holding the run directory's lock.
void require_checkpoints_writable(const std::string& run_dir, int64_t last_step, int world_size);

}  // namespace mantissa::launcher
