#include "core/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace mantissa::core {

void fsync_path(const std::string& path) {
  // O_RDONLY suffices: fsync flushes the file's (or directory's) data whatever the mode.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MANTISSA_REQUIRE(fd >= 0, kFailure,
                   "cannot open '" << path << "' to sync it: " << std::strerror(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  MANTISSA_REQUIRE(rc == 0, kFailure, "fsync of '" << path << "' failed: " << std::strerror(error));
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  MANTISSA_REQUIRE(fd >= 0, kFailure, "cannot create '" << temp << "': " << std::strerror(errno));
  std::string failed;  // the step that failed, with its reason
  for (size_t written = 0; written < bytes.size() && failed.empty();) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) failed = std::string("cannot write '") + temp + "': " + std::strerror(errno);
    if (n > 0) written += static_cast<size_t>(n);
  }
  if (failed.empty() && ::fsync(fd) != 0) {
    failed = "cannot write '" + temp + "': fsync: " + std::strerror(errno);
  }
  if (::close(fd) != 0 && failed.empty()) {
    failed = "cannot write '" + temp + "': close: " + std::strerror(errno);
  }
  if (failed.empty() && ::rename(temp.c_str(), path.c_str()) != 0) {
    failed = "cannot rename '" + temp + "' to '" + path + "': " + std::strerror(errno);
  }
  if (!failed.empty()) {
    ::unlink(temp.c_str());
    throw Error(failed);
  }
  const std::string dir = std::filesystem::path(path).parent_path().string();
  fsync_path(dir.empty() ? "." : dir);
}

}  // namespace mantissa::core
