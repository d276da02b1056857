// How a rank waits for a collective it can only poll: MPI advances a non-blocking collective
// only inside MPI calls, and NCCL's completion is an event to query. For the first kSpin of a
// wait it polls without sleeping (yielding the core between polls): most waits end within it, and a
// collective's pieces advance only while a rank calls into MPI (with 1 ms, bench_dist_train's
// exposed communication doubled, about 10 ms more per step; with 20 ms it was unchanged). A longer
// wait sleeps kPollInterval between polls, as PyTorch's blocking NCCL wait sleeps between queries:
// a rank spinning through it holds its core from whatever else must run there, and when that is
// another job's rank bound to the same core, the kernel's group scheduling (a session's autogroup,
// a cgroup) can starve it almost entirely. Two 2-rank jobs started from two shells on 2 cores, each
// rank spinning while its peer waited behind the other job's spinner, took minutes per step.
#pragma once

#include <chrono>
#include <thread>

namespace mantissa::dist {

inline constexpr std::chrono::milliseconds kSpin{20};
// As short as a sleep usefully is (the kernel's default timer slack is 50 us).
inline constexpr std::chrono::microseconds kPollInterval{100};

// Calls done() until it returns true, or until timeout_s have passed; whether done() did.
template <class Done>
bool poll_for(Done done, double timeout_s) {
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  while (!done()) {
    const auto now = Clock::now();
    if (now > deadline) return false;
    if (now - start < kSpin) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kPollInterval);
    }
  }
  return true;
}

// Calls done() until it returns true. Past timeout_s, calls timed_out(seconds waited), which
// must not return.
template <class Done, class TimedOut>
void poll_until(Done done, double timeout_s, TimedOut timed_out) {
  const auto start = std::chrono::steady_clock::now();
  if (poll_for(done, timeout_s)) return;
  timed_out(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

}  // namespace mantissa::dist
