#include <cblas.h>

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
  const std::string convert = avx512::narrow_enabled()
                                  ? "conversions AVX-512 (stochastic rounding, FP8) and AVX2/F16C, "
                                    "GELU and attention AVX-512"
                                  : "conversions AVX2/F16C, GELU and attention AVX2";
  // OpenBLAS picks its kernels by CPU (OPENBLAS_CORETYPE overrides it): "Haswell" is AVX2's.
  return "CPU paths: " + gemm + ", FP16 GEMM AVX2/FMA kernel, FP32 GEMM OpenBLAS sgemm (" +
         openblas_get_corename() + " kernels), " + convert;
}

}  // namespace mantissa::core
