// The row loops of the CPU's softmax (attention, cross-entropy) around softmax.h's per-element
// formulas: the row's maximum and its sum eight lanes at a time, and exp(z - max) in place.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

#include "core/ops/math/softmax.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_softmax_rows.h needs AVX2 and FMA (build with -march=x86-64-v3)"
#endif

namespace mantissa::core {

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

// z[i] = softmax_exp(z[i], row_max) for i < n, in place. exp_f32 is straight-line arithmetic,
// so GCC vectorises this loop (eight or sixteen lanes, as the file including it is compiled).
inline void softmax_exp_row(float* z, int64_t n, float row_max) {
  for (int64_t i = 0; i < n; ++i) z[i] = softmax_exp(z[i], row_max);
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
