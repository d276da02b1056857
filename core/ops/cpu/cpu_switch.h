// Environment switches that turn a CPU fast path off (MANTISSA_CPU_BF16_GEMM,
// MANTISSA_CPU_AVX512_CONVERT, MANTISSA_CPU_AMX), as the backend reads them. check_cpu_switches(),
// which reads them all, is declared for code outside the backend in core/ops/cpu_switches.h.
#pragma once

#include "core/ops/cpu_switches.h"

namespace mantissa::core {

inline constexpr const char* kBf16GemmSwitch = "MANTISSA_CPU_BF16_GEMM";
inline constexpr const char* kAvx512ConvertSwitch = "MANTISSA_CPU_AVX512_CONVERT";
inline constexpr const char* kAmxSwitch = "MANTISSA_CPU_AMX";

// The value of the switch `variable`: true when it is unset or "1", false when it is "0".
// Anything else is an error naming the variable and its value, so that a misspelt "off" does
// not silently leave the path on.
bool cpu_switch_on(const char* variable);

}  // namespace mantissa::core
