#include "core/interrupt.h"

#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdlib>

namespace mantissa::core {

namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// Lock-free, so the handler may store to it (from whichever thread it runs on).
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
// Which of kSignals have the handler: set before it is installed, read by the handler.
std::atomic<bool> g_installed[std::size(kSignals)];
// Their actions before, put back when the watch ends.
struct sigaction g_old_actions[std::size(kSignals)];

extern "C" void on_interrupt(int signal) {
  const int saved_errno = errno;
  g_signal.store(signal);
  // The next signal of any of them ends the process at once (signal(2) is async-signal-safe).
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    if (g_installed[i].load()) ::signal(kSignals[i], SIG_DFL);
  }
  // write(2) is async-signal-safe; stdio is not.
  static const char kNote[] = "\nmantissa: interrupted: stopping (again to quit at once)\n";
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, kNote, sizeof kNote - 1);
  errno = saved_errno;
}

sigset_t interrupt_set() {
  sigset_t set;
  sigemptyset(&set);
  for (const int signal : kSignals) sigaddset(&set, signal);
  return set;
}

// "SIGINT", "SIGTERM" or "SIGHUP", for messages.
const char* interrupt_signal_name(int signal) {
  switch (signal) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    default: return "a signal";
  }
}

}  // namespace

Interrupted::Interrupted(int signal, const std::string& outcome)
    : std::runtime_error(std::string("interrupted by ") + interrupt_signal_name(signal) + ": " +
                         outcome),
      signal_(signal) {}

void throw_if_interrupted(const std::string& outcome) {
  if (const int signal = g_signal.load(); signal != 0) throw Interrupted(signal, outcome);
}

InterruptWatch::InterruptWatch() {
  g_signal.store(0);
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  // A signal during a read or a write must not turn into an I/O error: the call restarts, and
  // the work sees the flag at its next check.
  action.sa_flags = SA_RESTART;
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    sigaction(kSignals[i], nullptr, &g_old_actions[i]);
    g_installed[i].store(g_old_actions[i].sa_handler != SIG_IGN);  // nohup's SIGHUP stays so
    if (g_installed[i].load()) sigaction(kSignals[i], &action, nullptr);
  }
}

InterruptWatch::~InterruptWatch() {
  for (size_t i = 0; i < std::size(kSignals); ++i) {
    if (g_installed[i].exchange(false)) sigaction(kSignals[i], &g_old_actions[i], nullptr);
  }
}

void InterruptWatch::run_uninterrupted(const std::function<void()>& work) {
  const sigset_t held = interrupt_set();
  sigset_t before;
  pthread_sigmask(SIG_BLOCK, &held, &before);
  struct Release {
    const sigset_t* mask;
    ~Release() { pthread_sigmask(SIG_SETMASK, mask, nullptr); }
  } release{&before};
  throw_if_interrupted();
  work();
}

void end_by_signal(int signal) {
  ::signal(signal, SIG_DFL);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, signal);
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
  ::raise(signal);
  std::_Exit(128 + signal);  // not reached: the default action of all three ends the process
}

}  // namespace mantissa::core
