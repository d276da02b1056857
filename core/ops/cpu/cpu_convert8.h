// Eight-lane AVX2 conversions between FP32 and the storage dtypes, bit-identical to the
// scalar functions of core/dtype/dtype.h (NaN patterns included). Shared by the bulk
// conversions of cpu_convert.cpp and the AVX2 GEMM (cpu_gemm_avx2.cpp), which widens its
// operands while it packs them and rounds a BF16 result as it stores it.
//
// decode8(p): the eight stored values at p (unaligned) as FP32, exactly to_float(p[i]).
//  - BF16 is the top half of an FP32 pattern: a shift.
//  - FP16 goes through the F16C instruction, which is exact; E5M2 and E4M3 are first
//    rewritten as FP16 patterns.
//  - NaNs then get dtype.h's canonical pattern (all exponent and mantissa bits set, sign
//    kept).
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/dtype/dtype.h"

#if !defined(__AVX2__) || !defined(__F16C__)
#error "cpu_convert8.h needs AVX2 and F16C (build with -march=x86-64-v3)"
#endif

namespace mantissa::core::convert8_detail {

inline __m256 abs_mask() {
  return _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
}

// NaN lanes take dtype.h's decoded NaN: all exponent and mantissa bits set, sign kept.
inline __m256 canonical_nan(__m256 x) {
  return _mm256_blendv_ps(x, _mm256_or_ps(x, abs_mask()), _mm256_cmp_ps(x, x, _CMP_UNORD_Q));
}

inline __m128i load8_bytes(const void* p) {
  return _mm_loadl_epi64(static_cast<const __m128i*>(p));
}
inline __m128i load8_words(const void* p) {
  return _mm_loadu_si128(static_cast<const __m128i*>(p));
}

}  // namespace mantissa::core::convert8_detail

namespace mantissa::core {

inline __m256 decode8(const float* p) {
  return _mm256_loadu_ps(p);
}

inline __m256 decode8(const bf16* p) {
  return _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_cvtepu16_epi32(convert8_detail::load8_words(p)), 16));
}

inline __m256 decode8(const fp16* p) {
  return convert8_detail::canonical_nan(_mm256_cvtph_ps(convert8_detail::load8_words(p)));
}

// E5M2 has FP16's exponent width and bias: a code is the top byte of the FP16 pattern.
inline __m256 decode8(const fp8_e5m2* p) {
  return convert8_detail::canonical_nan(
      _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepu8_epi16(convert8_detail::load8_bytes(p)), 8)));
}

// E4M3 -> FP16 pattern: exponent and mantissa fields slide into FP16's positions (mantissa 3
// -> 10 bits; sign-extending the byte first puts the sign at bit 15, and bit 14 is cleared).
// FP16's bias is 15 instead of 7, so the pattern reads as the value times 2^-8 -- subnormals
// too, since both formats scale their subnormals like their smallest exponent -- and the
// exact product by 2^8 restores it. The NaN magnitude 0x7F reads as 1.875 (480 after the
// product), which no other code gives, and is replaced.
inline __m256 decode8(const fp8_e4m3* p) {
  const __m128i shifted = _mm_slli_epi16(_mm_cvtepi8_epi16(convert8_detail::load8_bytes(p)), 7);
  const __m128i half = _mm_andnot_si128(_mm_set1_epi16(0x4000), shifted);
  const __m256 value = _mm256_mul_ps(_mm256_cvtph_ps(half), _mm256_set1_ps(256.0f));
  const __m256 magnitude = _mm256_and_ps(value, convert8_detail::abs_mask());
  const __m256 is_nan = _mm256_cmp_ps(magnitude, _mm256_set1_ps(480.0f), _CMP_EQ_OQ);
  return _mm256_blendv_ps(value, _mm256_or_ps(value, convert8_detail::abs_mask()), is_nan);
}

// bf16_from_float of eight values, as 32-bit lanes holding the codes: adding 0x7FFF plus the
// lowest kept bit, then truncating, rounds to nearest even; NaN becomes 0x7FFF instead of
// being rounded (possibly into inf).
inline __m256i bf16_round8(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i lowest_kept = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded = _mm256_srli_epi32(
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7FFF), lowest_kept)), 16);
  const __m256i abs_bits = _mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i is_nan = _mm256_cmpgt_epi32(abs_bits, _mm256_set1_epi32(0x7F800000));
  return _mm256_blendv_epi8(rounded, _mm256_set1_epi32(0x7FFF), is_nan);
}

}  // namespace mantissa::core
