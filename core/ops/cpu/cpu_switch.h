// Environment switches that turn a CPU fast path off (MANTISSA_CPU_BF16_GEMM,
// MANTISSA_CPU_AVX512_CONVERT).
#pragma once

namespace mantissa::core {

// The value of the switch `variable`: true when it is unset or "1", false when it is "0".
// Anything else is an error naming the variable and its value, so that a misspelt "off" does
// not silently leave the path on.
bool cpu_switch_on(const char* variable);

}  // namespace mantissa::core
