#include "core/error.h"

#include <cerrno>
#include <cstring>

namespace mantissa::core {

void throw_error(const std::string& message, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  throw Error(message + " [" + (base ? base + 1 : file) + ":" + std::to_string(line) + "]");
}

void throw_error_of_kind(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kConfig: throw ConfigError(message);
    case ErrorKind::kDiverged: throw DivergedError(message);
    default: throw Error(message);
  }
}

ErrorKind path_error_kind(int error) {
  switch (error) {
    case EACCES:
    case EPERM:
    case EROFS:
    case EEXIST:
    case EISDIR:
    case ENOTDIR:
    case ELOOP:
    case ENAMETOOLONG: return ErrorKind::kConfig;
    default: return ErrorKind::kFailure;
  }
}

}  // namespace mantissa::core
