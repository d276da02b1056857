// Environment switches that turn a CPU fast path off (MANTISSA_CPU_BF16_GEMM,
// MANTISSA_CPU_AVX512_CONVERT, MANTISSA_CPU_AMX), as the backend reads them (env_switch_on).
// check_cpu_switches(), which reads them all, is declared for code outside the backend in
// core/ops/cpu_switches.h.
#pragma once

#include "core/env_switch.h"
#include "core/ops/cpu_switches.h"

namespace mantissa::core {

inline constexpr const char* kBf16GemmSwitch = "MANTISSA_CPU_BF16_GEMM";
inline constexpr const char* kAvx512ConvertSwitch = "MANTISSA_CPU_AVX512_CONVERT";
inline constexpr const char* kAmxSwitch = "MANTISSA_CPU_AMX";

}  // namespace mantissa::core
