// LD_PRELOAD shim for test_train.py: the first write(2) to a temporary file (a name ending in
// ".tmp") creates the file HOLD_WRITE_MARKER names and waits for a signal before it writes, so
// that a test can interrupt a command while it has a half-written output, however fast the
// write would otherwise be.
#include <dlfcn.h>
#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {

std::atomic<bool> g_held{false};

bool names_a_temporary(int fd) {
  char link[64];
  char target[4096];
  if (std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd) <= 0) return false;
  const ssize_t n = ::readlink(link, target, sizeof target);
  return n > 0 && std::string_view(target, static_cast<size_t>(n)).ends_with(".tmp");
}

}  // namespace

extern "C" ssize_t write(int fd, const void* data, size_t size) {
  using Write = ssize_t (*)(int, const void*, size_t);
  static const Write real_write = reinterpret_cast<Write>(dlsym(RTLD_NEXT, "write"));
  const char* marker = std::getenv("HOLD_WRITE_MARKER");
  if (marker != nullptr && names_a_temporary(fd) && !g_held.exchange(true)) {
    const int made = ::open(marker, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (made >= 0) ::close(made);
    ::pause();  // returns once a caught signal's handler has run
  }
  return real_write(fd, data, size);
}
