// Exit codes of the mantissa executable (also listed by `mantissa train --help`): 0 for
// success, otherwise the kind of the error that ended the run (core::ErrorKind, where each
// code is explained).
#pragma once

#include "core/error.h"

namespace mantissa::launcher {

// The run finished all its steps, or it was asked to stop (SIGUSR1/SIGTERM) and every rank
// stopped at the same step after its checkpoint was written: requeue it to continue.
inline constexpr int kExitOk = 0;
// Stopped the same way by SIGINT (Ctrl-C), with the shell's code for an interrupted program, so
// that a script running `mantissa train && next` does not go on as if the run were done.
inline constexpr int kExitInterrupted = 130;
inline constexpr int kExitFailure = core::exit_code(core::ErrorKind::kFailure);
inline constexpr int kExitConfig = core::exit_code(core::ErrorKind::kConfig);
inline constexpr int kExitPeerLost = core::exit_code(core::ErrorKind::kPeerLost);
inline constexpr int kExitDiverged = core::exit_code(core::ErrorKind::kDiverged);

}  // namespace mantissa::launcher
