// LD_PRELOAD shim for tests/multinode/test_slurm_init_barrier.py: holds rank 0 (SLURM_PROCID 0)
// inside MPI_Init for HOLD_AFTER_MODEX_S seconds right after its modex fence, before it sets
// up the receiving side of its point-to-point layer, and prints "rank 0 held from T0 to T1"
// (CLOCK_REALTIME seconds). MPI_Init's last step is a barrier, so no other rank may leave
// MPI_Init before T1; a rank that does would send its first message to a rank not ready for it
// (Open MPI 4.1 then dies with SIGSEGV).
//
// Open MPI 4.1's ompi_mpi_init calls mca_pml_base_bsend_init through the PLT right after the
// modex fence, so a definition here comes first; it then calls the library's own.
#include <dlfcn.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace {

double realtime_seconds() {
  timespec now{};
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

}  // namespace

extern "C" int mca_pml_base_bsend_init(bool thread_multiple) {
  using Function = int (*)(bool);
  const auto library_own = reinterpret_cast<Function>(dlsym(RTLD_NEXT, "mca_pml_base_bsend_init"));
  if (library_own == nullptr) {
    std::fprintf(stderr, "hold_after_modex: no mca_pml_base_bsend_init after the shim: %s\n",
                 dlerror());
    std::abort();
  }
  const char* rank = std::getenv("SLURM_PROCID");
  const char* hold = std::getenv("HOLD_AFTER_MODEX_S");
  if (rank != nullptr && std::strcmp(rank, "0") == 0 && hold != nullptr) {
    const double from = realtime_seconds();
    const double seconds = std::atof(hold);
    timespec pause{static_cast<time_t>(seconds),
                   static_cast<long>((seconds - static_cast<time_t>(seconds)) * 1e9)};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
    }
    std::printf("rank 0 held from %.9f to %.9f\n", from, realtime_seconds());
    std::fflush(stdout);
  }
  return library_own(thread_multiple);
}
