#include "launcher/tokenize_interrupt.h"

#include <unistd.h>

#include <cstring>

namespace mantissa::launcher {

namespace {

volatile std::sig_atomic_t g_signal = 0;

extern "C" void on_interrupt(int signal) {
  g_signal = signal;
  // write(2) is async-signal-safe; stdio is not.
  static const char kNote[] =
      "\nmantissa: interrupted: removing what this encode wrote (again to quit at once)\n";
  [[maybe_unused]] const ssize_t written = ::write(STDERR_FILENO, kNote, sizeof kNote - 1);
}

}  // namespace

Interrupted::Interrupted(int signal)
    : std::runtime_error(std::string("interrupted by SIG") + ::sigabbrev_np(signal) +
                         ": nothing written, the output directory left as it was"),
      signal_(signal) {}

InterruptWatch::InterruptWatch() {
  g_signal = 0;
  struct sigaction action {};
  action.sa_handler = on_interrupt;
  sigemptyset(&action.sa_mask);
  // A signal during a read or a write must not turn into an I/O error: the call restarts, and
  // the encode sees the flag at its next check. The second signal takes the default action.
  action.sa_flags = SA_RESTART | SA_RESETHAND;
  sigaction(SIGINT, &action, &old_int_);
  sigaction(SIGTERM, &action, &old_term_);
  sigaction(SIGHUP, &action, &old_hup_);
}

InterruptWatch::~InterruptWatch() {
  sigaction(SIGINT, &old_int_, nullptr);
  sigaction(SIGTERM, &old_term_, nullptr);
  sigaction(SIGHUP, &old_hup_, nullptr);
}

void InterruptWatch::throw_if_interrupted() const {
  if (const int signal = g_signal; signal != 0) throw Interrupted(signal);
}

}  // namespace mantissa::launcher
