// The dot product of two FP32 rows in a fixed order, for the CPU attention kernels (the
// backward's sum P . dP per row, the decoder's q . k per cached position).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

namespace mantissa::core {

// sum_{i < n} a[i] b[i]: lane l of eight sums i = l, l + 8, ... by fused multiply-adds (with
// -march=x86-64-v3 the vector type is one AVX2 register and `acc += x * y` one FMA), the lanes
// added in order, then the last n % 8 products. A sum carried one product at a time would
// wait on every addition.
inline float row_dot(const float* a, const float* b, int64_t n) {
  typedef float f32x8 __attribute__((vector_size(32)));
  f32x8 acc = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f32x8 x, y;
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    acc += x * y;
  }
  float sum = 0.0f;
  for (int l = 0; l < 8; ++l) sum += acc[l];
  for (; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

}  // namespace mantissa::core
