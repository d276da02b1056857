// A bound on the start and the end of an MPI job. MPI_Init and the gathers that follow it, and
// MPI_Finalize, wait for every rank of the job without a timeout of their own: a rank that
// never starts (a host whose daemon did not come up, a process stopped before it joined), or
// one stopped after the last collective, left the others waiting, silent, until the
// scheduler's time limit. The watchdog ends this process once the wait has taken
// MANTISSA_MPI_START_TIMEOUT_S seconds (default 600; 0: no bound), saying so, with the exit
// code of a lost peer; mpirun and srun then end the job (mpirun, which waits for a lost host's
// daemon, within deploy/mantissa-mpirun's grace).
#pragma once

#include <condition_variable>
#include <mutex>
#include <thread>

namespace mantissa::dist {

// MANTISSA_MPI_START_TIMEOUT_S: seconds, a number in [0, 1e9] (0: no bound); unset: 600. Anything
// else throws core::ConfigError "environment: <VARIABLE>=<value>: ...". Readable without MPI,
// so that `mantissa config` checks it too.
double mpi_start_timeout_s();

// Which wait for every rank is watched: the message says it.
enum class MpiWait { kStart, kEnd };

class MpiWatchdog {
 public:
  // Starts the watch (no thread when timeout_s is 0).
  MpiWatchdog(double timeout_s, MpiWait wait);
  // The wait is over: the watch ends.
  ~MpiWatchdog();
  MpiWatchdog(const MpiWatchdog&) = delete;
  MpiWatchdog& operator=(const MpiWatchdog&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable done_changed_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace mantissa::dist
