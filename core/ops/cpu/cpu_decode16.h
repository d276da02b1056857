// Sixteen-lane AVX-512 loads of stored values as FP32, exactly to_float(x[i]) for the lanes
// set in `lanes` (zero elsewhere): the loads of cpu_narrow_avx512.cpp and
// cpu_quantize_runs_avx512.cpp. Include it only between those files' `#pragma GCC
// target("avx512f,avx512bw,avx512vl,avx512dq")` and pop_options, as cpu_fp8_round16.h.
#pragma once

#include <immintrin.h>

#include "core/dtype/dtype.h"

namespace mantissa::core::avx512 {

inline __m512 decode16(const float* x, __mmask16 lanes) {
  return _mm512_maskz_loadu_ps(lanes, x);
}

// BF16 is the top half of an FP32 pattern.
inline __m512 decode16(const bf16* x, __mmask16 lanes) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(lanes, x)), 16));
}

// F16C is exact. A NaN stays a NaN but not dtype.h's canonical pattern: callers only round it
// or take its magnitude, where every NaN pattern acts alike.
inline __m512 decode16(const fp16* x, __mmask16 lanes) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(lanes, x));
}

}  // namespace mantissa::core::avx512
