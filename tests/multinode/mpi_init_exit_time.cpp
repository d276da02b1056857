// A rank that prints when it left MPI_Init: "rank R of N left MPI_Init at T" (T: seconds of
// CLOCK_REALTIME, which every host of the test cluster shares, since its hosts are namespaces of
// one kernel). tests/multinode/test_slurm_init_barrier.py launches it in place of mantissa.
#include <mpi.h>

#include <cstdio>
#include <ctime>

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::printf("rank %d of %d left MPI_Init at %lld.%09ld\n", rank, size,
              static_cast<long long>(now.tv_sec), now.tv_nsec);
  std::fflush(stdout);
  MPI_Barrier(MPI_COMM_WORLD);
  MPI_Finalize();
  return 0;
}
