#include "core/error.h"

#include <cstring>

namespace mantissa::core {

void throw_error(const std::string& message, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  throw Error(message + " [" + (base ? base + 1 : file) + ":" + std::to_string(line) + "]");
}

}  // namespace mantissa::core
