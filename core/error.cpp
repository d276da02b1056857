#include "core/error.h"

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

}  // namespace mantissa::core
