// LD_PRELOAD shim for test_train.py: the rank whose OMPI_COMM_WORLD_RANK is HOLD_FINALIZE_RANK
// sleeps HOLD_FINALIZE_S seconds before it calls the library's MPI_Finalize, as a rank
// stopped after the job's last collective (SIGSTOP, a hung file system) would. MPI_Finalize
// waits for every rank, so the other ranks wait in theirs.
#include <mpi.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>

extern "C" int MPI_Finalize() {
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const char* held = std::getenv("HOLD_FINALIZE_RANK");
  const char* hold = std::getenv("HOLD_FINALIZE_S");
  if (rank != nullptr && held != nullptr && hold != nullptr && std::strcmp(rank, held) == 0) {
    const double seconds = std::atof(hold);
    timespec pause{static_cast<time_t>(seconds),
                   static_cast<long>((seconds - static_cast<time_t>(seconds)) * 1e9)};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
    }
  }
  return PMPI_Finalize();
}
