// An on/off environment switch (MANTISSA_CPU_*, MANTISSA_MPI_PROGRESS_THREAD): unset or 1 is
// on, 0 is off.
#pragma once

namespace mantissa::core {

// The value of the switch `variable`: true when it is unset or "1", false when it is "0".
// Anything else is an error naming the variable and its value, so that a misspelt "off" does
// not silently leave the path on.
bool env_switch_on(const char* variable);

}  // namespace mantissa::core
