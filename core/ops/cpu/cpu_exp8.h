// expf of eight FP32 values at a time, bit-identical to the C library's expf, for the CPU's
// softmax loops (attention, cross-entropy), whose per-element formula is softmax.h's
// softmax_exp: expf(z - max). A call per element costs several times the arithmetic.
//
// The C library is glibc (2.28 and later), whose expf (sysdeps/ieee754/flt-32/e_expf.c) our
// x86-64-v3 binaries always reach as its FMA variant. It computes in double precision:
//   z = x N / ln2 (N = 32) = k + r with integer k and |r| <= 1/2,
//   exp(x) = 2^(k/N) 2^(r/N) ~= s (C0 r^3 + C1 r^2 + C2 r + 1),   s = 2^(k/N) from a table,
// and rounds that double to float once. exp8 below performs the same double operations in
// the same order, the same fused multiply-adds included (read off the library's __expf_fma),
// on four lanes per register, so each lane's double result, hence its float, is the
// library's. Lanes with |x| >= 88 or NaN (where the library takes its overflow, underflow
// and special-value paths) are handed to expf itself. tests/core/test_cpu_exp8.cpp compares
// exp8 with expf over a dense sweep of all FP32 bit patterns and every special case.
#pragma once

#include <immintrin.h>

#include <bit>
#include <cmath>
#include <cstdint>

#include "core/ops/math/softmax.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_exp8.h needs AVX2 and FMA (build with -march=x86-64-v3)"
#endif

namespace mantissa::core {

namespace exp8_detail {

// glibc's __exp2f_data (exp2f_data.c): tab[i] is the bit pattern of 2^(i/N) minus i << 47,
// so that adding k << 47 (k's low bits then carry into the exponent) gives 2^(k/N).
alignas(32) inline constexpr uint64_t kTable[32] = {
    0x3ff0000000000000, 0x3fefd9b0d3158574, 0x3fefb5586cf9890f, 0x3fef9301d0125b51,
    0x3fef72b83c7d517b, 0x3fef54873168b9aa, 0x3fef387a6e756238, 0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715, 0x3feef1a7373aa9cb, 0x3feedea64c123422, 0x3feece086061892d,
    0x3feebfdad5362a27, 0x3feeb42b569d4f82, 0x3feeab07dd485429, 0x3feea47eb03a5585,
    0x3feea09e667f3bcd, 0x3fee9f75e8ec5f74, 0x3feea11473eb0187, 0x3feea589994cce13,
    0x3feeace5422aa0db, 0x3feeb737b0cdc5e5, 0x3feec49182a3f090, 0x3feed503b23e255d,
    0x3feee89f995ad3ad, 0x3feeff76f2fb5e47, 0x3fef199bdd85529c, 0x3fef3720dcef9069,
    0x3fef5818dcfba487, 0x3fef7c97337b9b5f, 0x3fefa4afa2a490da, 0x3fefd0765b6e4540,
};
inline constexpr double kInvLn2N = std::bit_cast<double>(uint64_t{0x40471547652b82fe});  // N/ln2
inline constexpr double kShift = std::bit_cast<double>(uint64_t{0x4338000000000000});    // 1.5 2^52
// The polynomial's coefficients, scaled for r in units of 1/N.
inline constexpr double kC0 = std::bit_cast<double>(uint64_t{0x3ebc6af84b912394});
inline constexpr double kC1 = std::bit_cast<double>(uint64_t{0x3f2ebfce50fac4f3});
inline constexpr double kC2 = std::bit_cast<double>(uint64_t{0x3f962e42ff0c52d6});
// |x| at or above 88.0f (and NaN, inf): the library's special paths.
inline constexpr int32_t kSpecialAbsBits = 0x42b00000;

// The library's main path on four lanes.
inline __m128 exp4_main(__m128 x) {
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d inv_ln2n = _mm256_set1_pd(kInvLn2N);
  const __m256d shift = _mm256_set1_pd(kShift);
  // kd = round(z) by the shift: its low bits hold k (ki), and kd - shift is k as a double.
  const __m256d shifted = _mm256_fmadd_pd(inv_ln2n, xd, shift);
  const __m256i ki = _mm256_castpd_si256(shifted);
  const __m256d kd = _mm256_sub_pd(shifted, shift);
  const __m256d r = _mm256_fmsub_pd(inv_ln2n, xd, kd);
  const __m256i t =
      _mm256_add_epi64(_mm256_i64gather_epi64(reinterpret_cast<const long long*>(kTable),
                                              _mm256_and_si256(ki, _mm256_set1_epi64x(31)), 8),
                       _mm256_slli_epi64(ki, 47));
  const __m256d s = _mm256_castsi256_pd(t);
  const __m256d z = _mm256_fmadd_pd(r, _mm256_set1_pd(kC0), _mm256_set1_pd(kC1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(kC2), _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, s));
}

}  // namespace exp8_detail

// expf of each lane, bit for bit.
inline __m256 exp8(__m256 x) {
  using namespace exp8_detail;
  __m256 y =
      _mm256_set_m128(exp4_main(_mm256_extractf128_ps(x, 1)), exp4_main(_mm256_castps256_ps128(x)));
  const __m256i abs_bits = _mm256_and_si256(_mm256_castps_si256(x), _mm256_set1_epi32(0x7FFFFFFF));
  const __m256i special = _mm256_cmpgt_epi32(abs_bits, _mm256_set1_epi32(kSpecialAbsBits - 1));
  if (!_mm256_testz_si256(special, special)) {
    alignas(32) float in[8], out[8];
    alignas(32) int32_t flag[8];
    _mm256_store_ps(in, x);
    _mm256_store_ps(out, y);
    _mm256_store_si256(reinterpret_cast<__m256i*>(flag), special);
    for (int i = 0; i < 8; ++i) {
      if (flag[i] != 0) out[i] = expf(in[i]);
    }
    y = _mm256_load_ps(out);
  }
  return y;
}

// The maximum of z[i] for i < n as softmax_max's scan finds it (-inf for n = 0; a NaN never
// wins), eight lanes at a time: MAXPS(z, m) is z > m ? z : m lane by lane, which is
// softmax_max, and the lanes' maxima combine through it too. A row holding both +0 and -0 as
// its maximum may keep the other zero than the scan would, which neither exp(z - max) nor
// max + log(sum) can tell apart.
inline float softmax_row_max(const float* z, int64_t n) {
  __m256 lanes_max = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) lanes_max = _mm256_max_ps(_mm256_loadu_ps(z + i), lanes_max);
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, lanes_max);
  float row_max = -INFINITY;
  for (const float lane : lanes) row_max = softmax_max(row_max, lane);
  for (; i < n; ++i) row_max = softmax_max(row_max, z[i]);
  return row_max;
}

// z[i] = softmax_exp(z[i], row_max) = expf(z[i] - row_max) for i < n, in place.
inline void softmax_exp_row(float* z, int64_t n, float row_max) {
  const __m256 max8 = _mm256_set1_ps(row_max);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(z + i, exp8(_mm256_sub_ps(_mm256_loadu_ps(z + i), max8)));
  for (; i < n; ++i) z[i] = softmax_exp(z[i], row_max);
}

// The sum of z[i] for i < n, rounded to FP32 once: the terms are added in FP64, in eight
// interleaved partial sums (a fixed order, whatever the compiler). A running FP32 sum over a
// row of 50,257 vocabulary terms drifts by up to 1e-4 relative and 1,024 attention terms by
// about 1e-5, and every probability would inherit that; the GPU's tree of partial sums stays
// within a few ulp of the exact sum, and so does this. A NaN term makes the sum NaN.
inline float softmax_row_sum(const float* z, int64_t n) {
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm_loadu_ps(z + i)));
    high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm_loadu_ps(z + i + 4)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(low, high));
  double sum = (lanes[0] + lanes[1]) + (lanes[2] + lanes[3]);
  for (; i < n; ++i) sum += z[i];
  return static_cast<float>(sum);
}

}  // namespace mantissa::core
