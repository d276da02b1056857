#include "core/ops/cpu/cpu_switch.h"

#include <cstdlib>
#include <initializer_list>
#include <string>

#include "core/error.h"
#include "core/ops/cpu_switches.h"

namespace mantissa::core {

bool cpu_switch_on(const char* variable) {
  const char* value = std::getenv(variable);
  if (value == nullptr) return true;
  const std::string setting(value);
  // The message is the user's whole problem: no source location.
  if (setting != "0" && setting != "1") {
    throw Error(std::string(variable) + "=" + setting + ": must be 0 (off) or 1 (on, the default)");
  }
  return setting == "1";
}

// Every switch the backend reads, listed once.
void check_cpu_switches() {
  for (const char* variable : {kBf16GemmSwitch, kAvx512ConvertSwitch, kAmxSwitch})
    cpu_switch_on(variable);
}

}  // namespace mantissa::core
