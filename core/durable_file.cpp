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

void fsync_parent_directory(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  fsync_path(parent.empty() ? "." : parent);
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  const std::string temp = path + ".tmp";
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int error = errno;
    throw_error_of_kind(path_error_kind(error),
                        "cannot create '" + temp + "': " + std::strerror(error));
  }
  // The step that failed and its errno, read before anything else can change it.
  std::string failed;
  int error = 0;
  for (size_t written = 0; written < bytes.size() && failed.empty();) {
    const ssize_t n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error = n < 0 ? errno : ENOSPC;  // a write of nothing: no room for more
      failed = "cannot write '" + temp + "'";
    } else {
      written += static_cast<size_t>(n);
    }
  }
  if (failed.empty() && ::fsync(fd) != 0) {
    error = errno;
    failed = "cannot write '" + temp + "': fsync";
  }
  if (::close(fd) != 0 && failed.empty()) {
    error = errno;
    failed = "cannot write '" + temp + "': close";
  }
  if (failed.empty() && ::rename(temp.c_str(), path.c_str()) != 0) {
    error = errno;
    failed = "cannot rename '" + temp + "' to '" + path + "'";
  }
  if (!failed.empty()) {
    ::unlink(temp.c_str());
    throw_error_of_kind(path_error_kind(error), failed + ": " + std::strerror(error));
  }
  fsync_parent_directory(path);
}

}  // namespace mantissa::core
