// The CPU's softmax row loops (core/ops/cpu/cpu_softmax_rows.h) against softmax.h's per-element
// formulas: softmax_exp_row is softmax_exp on each element, bit for bit (the vectorised loop
// against the scalar one, every lane and tail length, -inf and NaN among the values), and
// softmax_row_max is softmax_max's scan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/ops/cpu/cpu_softmax_rows.h"
#include "core/ops/math/softmax.h"

namespace mantissa::core {
namespace {

// softmax_exp on one element, in a call GCC cannot vectorise: the lanes' reference.
[[gnu::noinline]] float softmax_exp_scalar(float z, float row_max) {
  return softmax_exp(z, row_max);
}

TEST(CpuSoftmaxRows, SoftmaxExpRowIsSoftmaxExpPerElement) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 20.0f);
  for (int64_t n = 0; n <= 41; ++n) {
    std::vector<float> z(static_cast<size_t>(n) + 1);
    for (float& v : z) v = normal(rng);
    if (n > 3) z[2] = -INFINITY;
    if (n > 9) z[9] = NAN;
    const float row_max = normal(rng);
    std::vector<float> want = z;
    for (int64_t i = 0; i < n; ++i) want[i] = softmax_exp_scalar(z[i], row_max);
    softmax_exp_row(z.data(), n, row_max);
    for (int64_t i = 0; i <= n; ++i) {
      ASSERT_EQ(float_to_bits(z[i]), float_to_bits(want[i])) << "n " << n << ", element " << i;
    }
  }
}

// softmax_row_max is softmax_max's scan over the row: NaNs never win (a row of NaNs keeps
// -inf), -inf rows stay -inf, the maximum is found in any lane or in the tail, and nothing past
// n is read. Zeros of either sign compare by value only (the one freedom it takes).
TEST(CpuSoftmaxRows, SoftmaxRowMaxIsTheScanOfSoftmaxMax) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 20.0f);
  const auto scan = [](const std::vector<float>& z, int64_t n) {
    float m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) m = softmax_max(m, z[i]);
    return m;
  };
  for (int64_t n = 0; n <= 41; ++n) {
    for (int trial = 0; trial < 20; ++trial) {
      // One element past n holds +inf: a read past the row would return it.
      std::vector<float> z(static_cast<size_t>(n) + 1, INFINITY);
      for (int64_t i = 0; i < n; ++i) z[i] = normal(rng);
      if (n > 0 && trial % 4 == 1) z[rng() % n] = NAN;
      if (n > 0 && trial % 4 == 2) z[rng() % n] = -INFINITY;
      if (trial % 4 == 3) std::fill_n(z.begin(), n, trial % 8 == 3 ? NAN : -INFINITY);
      const float got = softmax_row_max(z.data(), n), want = scan(z, n);
      ASSERT_EQ(float_to_bits(got), float_to_bits(want)) << "n " << n << ", trial " << trial;
    }
  }
  const std::vector<float> zeros = {-0.0f, 0.0f, -0.0f, -1.0f, 0.0f, -2.0f, -0.0f, -3.0f, 0.0f};
  EXPECT_EQ(softmax_row_max(zeros.data(), static_cast<int64_t>(zeros.size())), 0.0f);
}

}  // namespace
}  // namespace mantissa::core
