#include "core/ops/cpu/cpu_switch.h"

#include <initializer_list>

#include "core/ops/cpu_switches.h"

namespace mantissa::core {

// Every switch the backend reads, listed once.
void check_cpu_switches() {
  for (const char* variable : {kBf16GemmSwitch, kAvx512ConvertSwitch, kAmxSwitch})
    env_switch_on(variable);
}

}  // namespace mantissa::core
