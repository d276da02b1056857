// Sources for block FP8 quantisation tests that reach its special cases, shared by the CPU
// tests and the GPU-against-CPU tests.
#pragma once

#include <cmath>
#include <cstdint>
#include <random>

#include "core/tensor/tensor.h"
#include "tests/common/test_util.h"

namespace mantissa::core {

// Rows of Gaussian values with magnitudes spread over the source dtype's range, and blocks
// of special values: zeros, subnormals, the largest finite magnitudes, inf, -inf and NaN.
inline Tensor special_source(const Shape& shape, DType dtype, uint32_t seed, bool non_finite) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int lo = dtype == DType::kF16 ? -20 : -135, hi = dtype == DType::kF16 ? 12 : 120;
  std::uniform_int_distribution<int> exponent(lo, hi);
  const float tiny = dtype == DType::kF16 ? std::ldexp(1.0f, -24) : std::ldexp(1.0f, -133);
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t rows = shape[0], cols = shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, exponent(rng));
    const int kind = static_cast<int>(rng() % 10);
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng) * magnitude;
      if (kind == 0) v = 0.0f;
      if (kind == 1) v = normal(rng) * tiny * 8.0f;  // subnormals
      if (kind == 2) v = (rng() % 2 ? 1.0f : -1.0f) * static_cast<float>(rng() % 4) * tiny;
      if (kind == 3) v = normal(rng) * (dtype == DType::kF16 ? 20000.0f : 1e37f);
      if (kind == 4) v = std::ldexp(static_cast<float>(rng() % 64) + 0.5f, -3);  // FP8 ties
      set_value(t, r * cols + c, v);
    }
  }
  if (non_finite) {
    set_value(t, 0, NAN);
    set_value(t, (rows / 2) * cols + cols / 2, INFINITY);
    set_value(t, rows * cols - 1, -INFINITY);
    set_value(t, (rows - 1) * cols / 3, -0.0f);
  }
  return t;
}

}  // namespace mantissa::core
