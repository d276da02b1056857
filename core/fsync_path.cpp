#include "core/fsync_path.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

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

}  // namespace mantissa::core
