// LD_PRELOAD shim for test_train.py: the first write(2) to a temporary file (a name ending in
// ".tmp") creates the file HOLD_WRITE_MARKER names and waits, before it writes, until one of
// the process's signal handlers has run, so that a test can interrupt a command while it has a
// half-written output, however fast the write would otherwise be. The handlers the process
// installs with sigaction(2) are wrapped to note that they ran: waiting for that note, not in
// pause(2), a signal that comes before the wait (between the marker and pause) or on another
// thread still ends it.
#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {

std::atomic<bool> g_held{false};
std::atomic<bool> g_handler_ran{false};
using Handler = void (*)(int);
std::atomic<Handler> g_handlers[NSIG];

void noting_handler(int signal) {
  g_handler_ran.store(true);
  g_handlers[signal].load()(signal);
}

bool names_a_temporary(int fd) {
  char link[64];
  char target[4096];
  if (std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd) <= 0) return false;
  const ssize_t n = ::readlink(link, target, sizeof target);
  return n > 0 && std::string_view(target, static_cast<size_t>(n)).ends_with(".tmp");
}

}  // namespace

extern "C" int sigaction(int signal, const struct sigaction* action, struct sigaction* old) {
  using Sigaction = int (*)(int, const struct sigaction*, struct sigaction*);
  static const Sigaction real_sigaction =
      reinterpret_cast<Sigaction>(dlsym(RTLD_NEXT, "sigaction"));
  const bool wraps = action != nullptr && (action->sa_flags & SA_SIGINFO) == 0 &&
                     action->sa_handler != SIG_DFL && action->sa_handler != SIG_IGN && signal > 0 &&
                     signal < NSIG;
  if (!wraps) return real_sigaction(signal, action, old);
  g_handlers[signal].store(action->sa_handler);
  struct sigaction noting = *action;
  noting.sa_handler = noting_handler;
  return real_sigaction(signal, &noting, old);
}

extern "C" ssize_t write(int fd, const void* data, size_t size) {
  using Write = ssize_t (*)(int, const void*, size_t);
  static const Write real_write = reinterpret_cast<Write>(dlsym(RTLD_NEXT, "write"));
  const char* marker = std::getenv("HOLD_WRITE_MARKER");
  if (marker != nullptr && names_a_temporary(fd) && !g_held.exchange(true)) {
    const int made = ::open(marker, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (made >= 0) ::close(made);
    while (!g_handler_ran.load()) ::usleep(1000);
  }
  return real_write(fd, data, size);
}
