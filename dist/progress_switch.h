// MANTISSA_MPI_PROGRESS_THREAD: whether each rank runs a thread that drives MPI's collectives
// while backward runs (dist/mpi/mpi_progress.h). Readable without MPI, so that the launcher
// checks it with the other switches before a run starts.
#pragma once

#include "core/env_switch.h"

namespace mantissa::dist {

// True when the variable is unset or 1, false when it is 0; core::Error naming the variable
// and its value for anything else (core::env_switch_on).
inline bool mpi_progress_thread_on() {
  return core::env_switch_on("MANTISSA_MPI_PROGRESS_THREAD");
}

}  // namespace mantissa::dist
