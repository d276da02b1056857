#include "launcher/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

namespace mantissa::launcher {

namespace {

// What the holder wrote: "pid <P> on <host>", or nothing when it had not written yet.
std::string holder_of(int fd) {
  char text[256] = {};
  const ssize_t n = ::pread(fd, text, sizeof text - 1, 0);
  std::string holder(text, n > 0 ? static_cast<size_t>(n) : 0);
  while (!holder.empty() && holder.back() == '\n') holder.pop_back();
  return holder;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kRunDirLockFile;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    // run.dir exists (the caller made it) but refuses the file: a directory this user may not
    // write to is a setting to fix; a full disk or a failing file system may not stay so.
    const int error = errno;
    core::throw_error_of_kind(core::path_error_kind(error),
                              "run.dir = \"" + run_dir +
                                  "\": cannot open the run directory's lock file '" + path +
                                  "': " + std::strerror(error));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = holder_of(fd_);
    ::close(fd_);
    fd_ = -1;
    MANTISSA_REQUIRE(error == EWOULDBLOCK, kFailure,
                     "cannot lock '" << path << "': " << std::strerror(error));
    throw core::ConfigError("run.dir = \"" + run_dir + "\": another run is using it" +
                            (holder.empty() ? "" : " (" + holder + ")") +
                            "; wait for it to end, or choose another run.dir");
  }
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  const std::string holder = "pid " + std::to_string(::getpid()) + " on " + host + "\n";
  // Only what a second run's message quotes: a failed write leaves the lock as good.
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd_, holder.data(), holder.size(), 0);
  }
}

RunDirLock::~RunDirLock() {
  if (fd_ < 0) return;
  // Emptied while still held, so that a finished run leaves no pid that reads as a holder; a
  // crash leaves it, and the kernel still drops the flock.
  [[maybe_unused]] const int truncated = ::ftruncate(fd_, 0);
  ::close(fd_);  // closing the only descriptor releases the flock
}

}  // namespace mantissa::launcher
