// LD_PRELOAD shim for test_train.py: fflush of a stream whose file's path ends with
// FAIL_STEP_LOG (e.g. "log/rank1.jsonl") fails with ENOSPC from its FAIL_STEP_LOG_AFTER-th call
// on (1: the first), as on a disk that has filled up, and flushes nothing.
#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <string_view>

namespace {

std::atomic<long> g_calls{0};

bool names_the_log(int fd, std::string_view suffix) {
  char link[64];
  char target[4096];
  if (std::snprintf(link, sizeof link, "/proc/self/fd/%d", fd) <= 0) return false;
  const ssize_t n = ::readlink(link, target, sizeof target);
  return n > 0 && std::string_view(target, static_cast<size_t>(n)).ends_with(suffix);
}

}  // namespace

extern "C" int fflush(std::FILE* stream) {
  using Flush = int (*)(std::FILE*);
  static const Flush real_fflush = reinterpret_cast<Flush>(dlsym(RTLD_NEXT, "fflush"));
  const char* suffix = std::getenv("FAIL_STEP_LOG");
  const char* after = std::getenv("FAIL_STEP_LOG_AFTER");
  if (stream != nullptr && suffix != nullptr && after != nullptr &&
      names_the_log(fileno(stream), suffix) && ++g_calls >= std::atol(after)) {
    errno = ENOSPC;
    return EOF;
  }
  return real_fflush(stream);
}
