#include "dist/mpi/mpi_progress.h"

#include <mpi.h>

#include "dist/mpi/mpi_check.h"
#include "dist/progress_switch.h"

namespace mantissa::dist {

std::shared_ptr<MpiProgress> MpiProgress::start() {
  if (!mpi_progress_thread_on()) return nullptr;
  int provided = MPI_THREAD_SINGLE;
  MANTISSA_MPI_CHECK(MPI_Query_thread(&provided));
  if (provided < MPI_THREAD_MULTIPLE) return nullptr;
  return std::shared_ptr<MpiProgress>(new MpiProgress());
}

MpiProgress::MpiProgress() : thread_([this] { run(); }) {}

MpiProgress::~MpiProgress() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_one();
  thread_.join();
}

void MpiProgress::begin() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    ++in_flight_;
  }
  wake_.notify_one();
}

void MpiProgress::end() {
  std::lock_guard<std::mutex> lock(mutex_);
  --in_flight_;
}

void MpiProgress::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [this] { return stop_ || in_flight_ > 0; });
    if (stop_) return;
    lock.unlock();
    // Any MPI call runs Open MPI's progress engine; a probe where nothing is sent is the
    // cheapest. Its result, and an error (the job is failing: the caller's own waits report
    // it), are of no interest here.
    int found = 0;
    MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_SELF, &found, MPI_STATUS_IGNORE);
    std::this_thread::sleep_for(kInterval);
    lock.lock();
  }
}

}  // namespace mantissa::dist
