#include "launcher/signals.h"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>

namespace mantissa::launcher {

namespace {

// Written by the handler, read by the training loop: lock-free atomics, which a handler may
// store to on whichever thread it runs (a volatile sig_atomic_t is only safe within one
// thread). SIGINT has one of its own, which no other signal's handler writes, so that Ctrl-C
// wins over a stop signal that comes with it, whichever handler runs last (exit 130, not 0: a
// wrapper that requeues a run that exits 0 must not requeue one its user interrupted).
std::atomic<bool> g_interrupted{false};
std::atomic<int> g_stop_signal{0};
std::atomic<bool> g_training{false};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free);

extern "C" void on_stop_signal(int signal) {
  const int saved_errno = errno;  // write(2) may set it under the code the signal interrupted
  if (signal != SIGINT) {
    g_stop_signal = signal;
  } else {
    g_interrupted = true;
    // write(2) is async-signal-safe; stdio is not.
    static const char kTraining[] =
        "\nmantissa: interrupted: stopping after this step with a checkpoint (Ctrl-C again to "
        "quit at once, without it)\n";
    static const char kStarting[] =
        "\nmantissa: interrupted: stopping once the start is done, before the first step "
        "(Ctrl-C again to quit at once)\n";
    [[maybe_unused]] const ssize_t written =
        g_training ? write(STDERR_FILENO, kTraining, sizeof kTraining - 1)
                   : write(STDERR_FILENO, kStarting, sizeof kStarting - 1);
  }
  errno = saved_errno;
}

}  // namespace

void install_stop_handlers() {
  struct sigaction action {};
  action.sa_handler = on_stop_signal;
  sigemptyset(&action.sa_mask);
  // Interrupted system calls restart: a signal during a file write or a collective must not
  // turn into an I/O error; the loop sees the flag at the end of the step.
  action.sa_flags = SA_RESTART;
  // A signal the process was started to ignore stays ignored: nohup's SIGHUP (the run is to
  // outlive the terminal), a background job's SIGINT.
  const auto install = [&action](int signal) {
    struct sigaction before {};
    sigaction(signal, nullptr, &before);
    if (before.sa_handler != SIG_IGN) sigaction(signal, &action, nullptr);
  };
  install(SIGUSR1);
  install(SIGTERM);
  install(SIGHUP);                              // the terminal went away (an ssh session dropped)
  action.sa_flags = SA_RESTART | SA_RESETHAND;  // the second Ctrl-C takes the default action
  install(SIGINT);
}

int stop_signal() {
  return g_interrupted ? SIGINT : g_stop_signal.load();
}

void note_training_begun() {
  g_training = true;
}

}  // namespace mantissa::launcher
