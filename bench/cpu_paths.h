// The line every CPU benchmark prints first: which of the CPU backend's code paths ran, so that
// figures from different machines (or from runs with a MANTISSA_CPU_* switch at 0) can be read
// side by side. The CPU features decide it (AVX512-BF16 for the native BF16 GEMM; AVX-512 F,
// BW, VL and DQ for the sixteen-lane conversions), and so do MANTISSA_CPU_BF16_GEMM and
// MANTISSA_CPU_AVX512_CONVERT.
#pragma once

#include <string>

#include "core/ops/cpu/cpu_gemm_bf16.h"
#include "core/ops/cpu/cpu_narrow_avx512.h"

namespace mantissa::bench {

// "CPU paths: ..." in one line. GEMMs with FP32 operands always run OpenBLAS sgemm; those with
// BF16 or FP8 operands run the native kernel or widen to FP32 for sgemm. Rounding to BF16 and
// F16 to nearest always runs AVX2/F16C code; stochastic rounding and FP8 casts run AVX-512 code
// where enabled.
inline std::string cpu_paths_description() {
  const std::string gemm = core::bf16_gemm_enabled()
                               ? "BF16/FP8 GEMM AVX512-BF16 kernel"
                               : "BF16/FP8 GEMM widened to FP32 for OpenBLAS sgemm";
  const std::string convert = core::avx512::narrow_enabled()
                                  ? "conversions AVX-512 (stochastic rounding, FP8) and AVX2/F16C"
                                  : "conversions AVX2/F16C";
  return "CPU paths: " + gemm + ", FP32 GEMM OpenBLAS sgemm, " + convert;
}

}  // namespace mantissa::bench
