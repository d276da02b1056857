// Sixteen-lane AVX-512 rounding of FP32 to the FP8 codes, bit-identical to dtype.h's
// float_to_small_rne (cpu_fp8_round8.h's eight-lane code, whose comments explain each step).
// Shared by cpu_narrow_avx512.cpp and cpu_quantize_runs_avx512.cpp. Include it only between
// those files' `#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")` and pop_options, so
// that every copy of these inline functions is compiled for AVX-512 and no baseline file
// sees them.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/dtype/dtype.h"
#include "core/ops/cpu/narrow_formats.h"

namespace mantissa::core::avx512 {

// (A function, not a lambda: the target pragma does not reach a lambda's body.)
inline __m512i fp8_broadcast16(uint32_t v) {
  return _mm512_set1_epi32(static_cast<int>(v));
}

// fp8_code_of_magnitude8 (cpu_fp8_round8.h, whose comment derives it) on sixteen lanes.
template <SmallFloatFormat F>
inline __m512i fp8_code_of_magnitude16(__m512i clamped) {
  constexpr auto broadcast = fp8_broadcast16;
  constexpr int kDrop = 23 - F.man_bits;
  const __m512i exponent = _mm512_max_epu32(_mm512_and_si512(clamped, broadcast(kF32InfBits)),
                                            broadcast(F.min_normal_bits));
  const __m512i magic = _mm512_add_epi32(exponent, broadcast(static_cast<uint32_t>(kDrop) << 23));
  const __m512i steps = _mm512_sub_epi32(
      _mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(clamped), _mm512_castsi512_ps(magic))),
      magic);
  constexpr uint32_t kRebias = (128u - F.bias) << F.man_bits;
  return _mm512_add_epi32(steps,
                          _mm512_sub_epi32(_mm512_srli_epi32(exponent, kDrop), broadcast(kRebias)));
}

// fp8_signed_code8 (cpu_fp8_round8.h) on sixteen lanes.
template <SmallFloatFormat F>
inline __m512i fp8_signed_code16(__m512i abs, uint32_t overflow, __m512i sign_bits) {
  constexpr auto broadcast = fp8_broadcast16;
  const __m512i clamped = _mm512_min_epu32(abs, broadcast(code_bits(F, overflow)));
  // code | ((sign_bits >> 24) & 0x80): ternary logic A | (B & C).
  return _mm512_ternarylogic_epi32(fp8_code_of_magnitude16<F>(clamped),
                                   _mm512_srli_epi32(sign_bits, 24), broadcast(0x80), 0xF8);
}

// float_to_small_rne for an 8-bit format on sixteen lanes; the codes in 32-bit lanes.
// kNaN = false leaves out the NaN test, for callers that know no lane is NaN.
template <SmallFloatFormat F, bool kNaN = true>
inline __m512i fp8_round16(__m512 x, Saturation saturation) {
  constexpr auto broadcast = fp8_broadcast16;
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i abs = _mm512_and_si512(bits, broadcast(0x7FFFFFFFu));
  const uint32_t overflow =
      saturation == Saturation::kSatFinite ? F.max_finite_code : F.overflow_code;
  const __m512i code = fp8_signed_code16<F>(abs, overflow, bits);
  if constexpr (!kNaN) return code;
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(abs, broadcast(kF32InfBits));
  return _mm512_mask_mov_epi32(code, is_nan, broadcast(F.nan_code));
}

}  // namespace mantissa::core::avx512
