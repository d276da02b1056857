#include "core/env_switch.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace mantissa::core {

bool env_switch_on(const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr) return true;
  const std::string setting(value);
  // The message is the user's whole problem: no source location.
  if (setting != "0" && setting != "1") {
    throw Error(std::string(variable) + "=" + setting + ": must be 0 (off) or 1 (on, the default)");
  }
  return setting == "1";
}

}  // namespace mantissa::core
