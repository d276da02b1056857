#include "launcher/run_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
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

// Whether `path` names the file open as `fd` (not another one since, or none).
bool names_file_of(const std::string& path, int fd) {
  struct stat named {};
  struct stat opened {};
  return ::stat(path.c_str(), &named) == 0 && ::fstat(fd, &opened) == 0 &&
         named.st_dev == opened.st_dev && named.st_ino == opened.st_ino;
}

// What the holder wrote. A holder writes once it has the lock: one that took it a moment ago
// may not have yet, so an empty file is read again for up to 0.5 s.
std::string holder_named_in(int fd) {
  std::string holder = holder_of(fd);
  for (int i = 0; i < 50 && holder.empty(); ++i) {
    ::usleep(10000);
    holder = holder_of(fd);
  }
  return holder;
}

}  // namespace

RunDirLock::RunDirLock(const std::string& run_dir) {
  const std::string path = run_dir + "/" + kRunDirLockFile;
  // A start that fails removes the lock file it held (RunDirCleanup). A run that opened that file
  // just before, and locks it just after, would hold a lock on a file no longer in run.dir, which
  // the next run does not see: so a lock counts only while the path still names its file, and
  // is taken again on the file there now.
  for (int attempt = 1;; ++attempt) {
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
      const std::string holder = error == EWOULDBLOCK ? holder_named_in(fd_) : "";
      ::close(fd_);
      fd_ = -1;
      MANTISSA_REQUIRE(error == EWOULDBLOCK, kFailure,
                       "cannot lock '" << path << "': " << std::strerror(error));
      throw core::ConfigError("run.dir = \"" + run_dir + "\": another run is using it" +
                              (holder.empty() ? "" : " (" + holder + ")") +
                              "; wait for it to end, or choose another run.dir");
    }
    if (names_file_of(path, fd_)) break;
    ::close(fd_);
    fd_ = -1;
    MANTISSA_REQUIRE(attempt < 10, kFailure,
                     "cannot lock '" << path << "': the file was removed each time it was locked ("
                                     << attempt << " times)");
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
