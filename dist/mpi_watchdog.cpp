#include "dist/mpi_watchdog.h"

#include <unistd.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/error.h"

namespace mantissa::dist {

namespace {

constexpr const char* kVariable = "MANTISSA_MPI_START_TIMEOUT_S";
constexpr double kDefaultSeconds = 600.0;
// Far above any start, and far below where a wait's deadline in nanoseconds would overflow.
constexpr double kLargestSeconds = 1e9;

// The rank the launcher gave this process, before MPI can say: Open MPI's, PMIx's or Slurm's.
std::string launcher_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"}) {
    if (const char* value = std::getenv(name); value != nullptr && *value != '\0') return value;
  }
  return "?";
}

}  // namespace

double mpi_start_timeout_s() {
  const char* text = std::getenv(kVariable);
  if (text == nullptr) return kDefaultSeconds;
  const std::string_view value(text);
  double seconds = -1.0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), seconds);
  if (value.empty() || error != std::errc() || end != value.data() + value.size() ||
      !(seconds >= 0.0 && seconds <= kLargestSeconds)) {
    throw core::ConfigError("environment: " + std::string(kVariable) + "=" + std::string(value) +
                            ": must be a number of seconds from 0 (no bound) to 1e9");
  }
  return seconds;
}

MpiWatchdog::MpiWatchdog(double timeout_s, MpiWait wait) {
  if (timeout_s <= 0.0) return;
  // The message is made now: MPI_Init may change the environment while the thread waits.
  char host[256] = "?";
  gethostname(host, sizeof host - 1);
  const char* what = wait == MpiWait::kStart
                         ? "the MPI start (MPI_Init, and every rank's host gathered)"
                         : "the MPI end (MPI_Finalize, which waits for every rank)";
  const char* why = wait == MpiWait::kStart
                        ? "a rank of the job did not start or cannot reach the others"
                        : "a rank of the job stopped answering after this rank's work had ended";
  char message[512];
  std::snprintf(message, sizeof message,
                "mantissa: rank %s (host %s): %s did not finish within %g s (%s): %s\n",
                launcher_rank().c_str(), host, what, timeout_s, kVariable, why);
  thread_ = std::thread([this, timeout_s, text = std::string(message)] {
    std::unique_lock<std::mutex> lock(mutex_);
    const auto limit = std::chrono::duration<double>(timeout_s);
    if (done_changed_.wait_for(lock, limit, [this] { return done_; })) return;
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
    std::_Exit(core::exit_code(core::ErrorKind::kPeerLost));
  });
}

MpiWatchdog::~MpiWatchdog() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_changed_.notify_one();
  thread_.join();
}

}  // namespace mantissa::dist
