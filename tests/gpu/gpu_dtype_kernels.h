// Exhaustive comparisons of core/dtype/dtype.h's device code against CUDA's own conversion
// intrinsics, run on the GPU (gpu_dtype_kernels.cu, compiled only when the build has CUDA).
// Plain C++ so that test_gpu_dtype.cpp can include it in every build.
#pragma once

#include <cstdint>

namespace mantissa::core::gpu_dtype_test {

// FP32 -> storage dtype, ours against CUDA's:
//   E4M3/E5M2: __nv_cvt_float_to_fp8 with __NV_SATFINITE or __NV_NOSAT,
//   BF16: __float2bfloat16_rn,   F16: __float2half_rn.
enum class Encoding { kE4M3SatFinite, kE4M3NoSat, kE5M2SatFinite, kE5M2NoSat, kBF16, kF16 };

// Storage dtype -> FP32, ours against CUDA's (FP8 through __nv_cvt_fp8_to_halfraw, then
// __half2float, both exact).
enum class Decoding { kE4M3, kE5M2, kBF16, kF16 };

struct Report {
  uint64_t checked = 0;     // inputs compared
  uint64_t mismatches = 0;  // inputs where the results differ (NaN matches any NaN)
  // The smallest mismatching input (FP32 bits, or the code for a decoding) and both results.
  uint32_t first_input = 0;
  uint32_t ours = 0;
  uint32_t cuda = 0;
};

// Every one of the 2^32 FP32 bit patterns, in chunks of 2^28 per launch. Codes must be
// equal, except that two NaN codes count as equal.
Report compare_encoding(Encoding encoding);

// Every code of the format (256 or 65536). FP32 results must be bit-identical, except that
// two NaNs count as equal.
Report compare_decoding(Decoding decoding);

}  // namespace mantissa::core::gpu_dtype_test
