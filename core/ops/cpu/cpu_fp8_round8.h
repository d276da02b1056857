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

// The code of a magnitude: `clamped` is the FP32 pattern of a non-negative value no larger than
// the value some code stands for (code_bits), FP32 subnormals included; the result is
// round_magnitude_rne's code for it, or 0 where that value underflows. With e the exponent of
// the value floored at the format's smallest normal exponent, M = 2^(e + 23 - man_bits) has
// the value's code spacing as its FP32 spacing, and the value is below 2^(e + 1), which keeps
// value + M in M's binade: the FPU's round-to-nearest-even in that addition rounds the value
// to a whole number of code steps, and (value + M) - M as patterns is that number, counted
// from 0 (2^man_bits steps up to 2^e, where e is normal). Adding M's exponent field gives the
// code; a value that rounds up to 2^(e + 1) carries into the next binade's first code.
template <SmallFloatFormat F>
inline __m256i fp8_code_of_magnitude8(__m256i clamped) {
  const auto broadcast = [](uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); };
  constexpr int kDrop = 23 - F.man_bits;  // FP32 mantissa bits that do not fit
  const __m256i exponent = _mm256_max_epu32(_mm256_and_si256(clamped, broadcast(kF32InfBits)),
                                            broadcast(F.min_normal_bits));
  const __m256i magic = _mm256_add_epi32(exponent, broadcast(static_cast<uint32_t>(kDrop) << 23));
  const __m256i steps = _mm256_sub_epi32(
      _mm256_castps_si256(_mm256_add_ps(_mm256_castsi256_ps(clamped), _mm256_castsi256_ps(magic))),
      magic);
  // A code's exponent field is the FP32 one less (127 - bias), and the steps count from the
  // binade below: hence 128 - bias.
  constexpr uint32_t kRebias = (128u - F.bias) << F.man_bits;
  return _mm256_add_epi32(steps,
                          _mm256_sub_epi32(_mm256_srli_epi32(exponent, kDrop), broadcast(kRebias)));
}

// The code of the magnitude `abs` (the FP32 pattern of a non-negative value, inf included)
// clamped to the value of the code `overflow`, with the sign bit of `sign_bits`. Clamping to
// the value of the code an overflow gives -- max finite when saturating, else inf (E5M2) or NaN
// (E4M3) read as a number -- rounds every magnitude above it to that code and leaves those
// below untouched.
template <SmallFloatFormat F>
inline __m256i fp8_signed_code8(__m256i abs, uint32_t overflow, __m256i sign_bits) {
  const auto broadcast = [](uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); };
  const __m256i clamped = _mm256_min_epu32(abs, broadcast(code_bits(F, overflow)));
  return _mm256_or_si256(fp8_code_of_magnitude8<F>(clamped),
                         _mm256_and_si256(_mm256_srli_epi32(sign_bits, 24), broadcast(0x80)));
}

// float_to_small_rne for an 8-bit format, eight lanes at a time; the codes in 32-bit lanes.
// kNaN = false leaves out the NaN test, for callers that know no lane is NaN.
template <SmallFloatFormat F, bool kNaN = true>
inline __m256i fp8_round8(__m256 x, Saturation saturation) {
  const auto broadcast = [](uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); };
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i abs = _mm256_and_si256(bits, broadcast(0x7FFFFFFFu));
  const uint32_t overflow =
      saturation == Saturation::kSatFinite ? F.max_finite_code : F.overflow_code;
  const __m256i code = fp8_signed_code8<F>(abs, overflow, bits);
  if constexpr (!kNaN) return code;
  return _mm256_blendv_epi8(code, broadcast(F.nan_code),
                            _mm256_cmpgt_epi32(abs, broadcast(kF32InfBits)));
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
