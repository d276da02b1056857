// Eight-lane AVX2 rounding of FP32 to the FP8 codes, bit-identical to dtype.h's
// float_to_small_rne (Rounder<fp8_e4m3/e5m2>::nearest). Shared by the bulk conversions of
// cpu_convert.cpp and the fused block quantisation of cpu_quantize_runs.cpp.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/dtype/dtype.h"
#include "core/ops/cpu/narrow_formats.h"

#if !defined(__AVX2__)
#error "cpu_fp8_round8.h needs AVX2 (build with -march=x86-64-v3)"
#endif

namespace mantissa::core {

// float_to_small_rne for an 8-bit format, eight lanes at a time; the codes in 32-bit lanes.
// kNaN = false leaves out the NaN test, for callers that know no lane is NaN.
template <SmallFloatFormat F, bool kNaN = true>
inline __m256i fp8_round8(__m256 x, Saturation saturation) {
  const auto broadcast = [](uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); };
  constexpr int kDrop = 23 - F.man_bits;  // FP32 mantissa bits that do not fit
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(bits, broadcast(0x7FFFFFFFu));

  // Overflow: |x| (inf included) is clamped to the value of the code an overflow gives -- max
  // finite when saturating, else inf (E5M2) or NaN (E4M3) read as a number -- which rounds to
  // that code. Every |x| above it overflows to that same code; those below are untouched.
  const uint32_t overflow =
      saturation == Saturation::kSatFinite ? F.max_finite_code : F.overflow_code;
  const __m256i clamped = _mm256_min_epu32(abs, broadcast(code_bits(F, overflow)));

  // Normal range, as round_magnitude_rne: add half an ulp minus one plus the lowest kept bit
  // and truncate (ties go to even; a carry moves into the exponent). Subtracting the bias
  // difference (127 - bias) from the exponent field first leaves the code after the shift.
  const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(clamped, kDrop), broadcast(1));
  const uint32_t round_and_rebias = (1u << (kDrop - 1)) - 1 - ((127u - F.bias) << 23);
  const __m256i normal = _mm256_srli_epi32(
      _mm256_add_epi32(_mm256_add_epi32(clamped, broadcast(round_and_rebias)), lowest_kept), kDrop);

  // Subnormal range: the FP32 ulp of 2^k, k = log2(smallest subnormal) + 23, is exactly the
  // subnormal step, so the FPU's round-to-nearest-even in |x| + 2^k rounds |x| to a whole
  // number of steps, and the low bits of the sum are that number: the code (reaching the
  // smallest normal's code when it rounds up past the largest subnormal).
  const __m256 magic = _mm256_castsi256_ps(broadcast((127u + 23 + 1 - F.bias - F.man_bits) << 23));
  const __m256i subnormal =
      _mm256_sub_epi32(_mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(abs), magic)),
                       _mm256_castps_si256(magic));

  __m256i code =
      _mm256_blendv_epi8(normal, subnormal, _mm256_cmpgt_epi32(broadcast(F.min_normal_bits), abs));
  code = _mm256_or_si256(code, _mm256_and_si256(_mm256_srli_epi32(bits, 24), broadcast(0x80)));
  if constexpr (!kNaN) return code;
  return _mm256_blendv_epi8(code, broadcast(F.nan_code),
                            _mm256_cmpgt_epi32(abs, broadcast(0x7F800000u)));
}

// Four vectors of 32-bit lanes holding 8-bit codes (a, b, c, d), stored as 32 bytes.
inline void store32_u8(void* dst, __m256i a, __m256i b, __m256i c, __m256i d) {
  // In 4-byte groups the two packs leave [a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7].
  const __m256i bytes = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
  _mm256_storeu_si256(
      static_cast<__m256i*>(dst),
      _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

}  // namespace mantissa::core
