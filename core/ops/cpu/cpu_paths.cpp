#include "core/ops/cpu/cpu_gemm_amx.h"
#include "core/ops/cpu/cpu_gemm_bf16.h"
#include "core/ops/cpu/cpu_narrow_avx512.h"
#include "core/ops/cpu_switches.h"

namespace mantissa::core {

std::string cpu_paths_description() {
  const std::string gemm = !bf16_gemm_enabled()
                               ? "BF16/FP8 GEMM AVX2/FMA kernel (FP32, widened while packing)"
                           : amx::enabled() ? "BF16/FP8 GEMM AMX-BF16 tiles"
                                            : "BF16/FP8 GEMM AVX512-BF16 kernel";
  const std::string convert =
      avx512::narrow_enabled()
          ? "conversions AVX-512 (stochastic rounding, FP8) and AVX2/F16C, GELU and attention AVX-512"
          : "conversions AVX2/F16C, GELU and attention AVX2";
  return "CPU paths: " + gemm + ", FP32 GEMM OpenBLAS sgemm, " + convert;
}

}  // namespace mantissa::core
