// MANTISSA_MPI_PROGRESS_THREAD: whether each rank runs a thread that drives MPI's collectives
// while backward runs (dist/mpi/mpi_progress.h). Read here, without MPI, so that the launcher
// checks it with the other switches before a run starts.
#pragma once

namespace mantissa::dist {

// True when the variable is unset or 1, false when it is 0; core::Error naming the variable
// and its value for anything else, so that a misspelt "off" does not leave the thread on.
bool mpi_progress_thread_on();

}  // namespace mantissa::dist
