// A thread that drives MPI's progress engine while non-blocking collectives are in flight.
//
// Open MPI advances a non-blocking collective only inside MPI calls: libnbc starts each round
// of its ring, the ob1 layer answers a rendezvous and queues the next fragments of a large
// message (3 of 128 KiB at a time by default) only when the process enters MPI. A rank busy
// with backward enters MPI only between layers (BucketedGradSync::grad_ready), so on a slow
// link a bucket's reduction moved a few fragments per layer and most of the communication
// waited for finish(): overlap hid almost nothing. This thread enters MPI (MPI_Iprobe on
// MPI_COMM_SELF, where nothing is ever sent) every kInterval while any collective is in
// flight, and sleeps on a condition variable otherwise. Reductions of the collectives
// then run on it too; each collective still combines its chunks in the same order, so the
// results are the same bits.
//
// Needs MPI_THREAD_MULTIPLE (World asks for it); without it, or with
// MANTISSA_MPI_PROGRESS_THREAD=0, there is no thread and collectives advance only in the
// caller's MPI calls, as before.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>

namespace mantissa::dist {

class MpiProgress {
 public:
  // The interval between two entries into MPI while collectives are in flight: short next to
  // a fragment's time on the wire (128 KiB at 10 Gbit/s: 100 us), long enough to cost little.
  static constexpr std::chrono::microseconds kInterval{100};

  // A running thread, or null when MPI is not initialised with MPI_THREAD_MULTIPLE or
  // MANTISSA_MPI_PROGRESS_THREAD=0 (no collective call: ranks may differ in this).
  static std::shared_ptr<MpiProgress> start();
  ~MpiProgress();  // stops and joins the thread
  MpiProgress(const MpiProgress&) = delete;
  MpiProgress& operator=(const MpiProgress&) = delete;

  // A collective started / completed: the thread runs while the count is above zero.
  void begin();
  void end();

 private:
  MpiProgress();
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  int in_flight_ = 0;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace mantissa::dist
