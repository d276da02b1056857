// Exit codes of the mantissa executable (also listed by `mantissa train --help`). Scripts and
// Slurm wrappers rely on them: after 2 or 4 a retry fails again; after 1 or 3 it may not.
#pragma once

#include "dist/world.h"

namespace mantissa::launcher {

// The run finished all its steps, or it was asked to stop (SIGUSR1/SIGTERM) and every rank
// stopped at the same step after its checkpoint was written: requeue it to continue.
inline constexpr int kExitOk = 0;
// A runtime failure: I/O, communication, a checkpoint that could not be written or read.
inline constexpr int kExitFailure = 1;
// A bad command line or configuration (including data files and devices it names, and a
// checkpoint in its run directory that does not fit it): nothing was trained.
inline constexpr int kExitConfig = 2;
// A peer rank stopped answering within dist.timeout_s (dist::World::kTimeoutExitCode: the
// rank that noticed ends the job, naming the silent ranks).
inline constexpr int kExitPeerLost = dist::World::kTimeoutExitCode;
// Training diverged: a non-finite loss, or gradients non-finite even at the minimum loss
// scale for precision.loss_scale.max_overflows_at_min steps in a row. Retrying as is would
// diverge again.
inline constexpr int kExitDiverged = 4;

}  // namespace mantissa::launcher
