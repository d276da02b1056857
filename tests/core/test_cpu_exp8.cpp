// exp8 and softmax_exp_row (core/ops/cpu/cpu_exp8.h) against the C library's expf, the
// function they promise to reproduce bit for bit (NaN patterns included): a dense sweep over
// all FP32 bit patterns, every pattern where the library switches paths (|x| near 88 and
// near -104), the special values, and rows of every length against softmax_exp per element;
// and softmax_row_max against softmax_max's scan.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/ops/cpu/cpu_exp8.h"
#include "core/ops/math/softmax.h"

namespace mantissa::core {
namespace {

// Runs exp8 over bits[0, n) (n a multiple of 8) and counts the lanes whose bits differ from
// expf's; the first few are reported.
int64_t count_mismatches(const std::vector<uint32_t>& bits) {
  int64_t bad = 0;
  for (size_t i = 0; i + 8 <= bits.size(); i += 8) {
    __m256 x;
    std::memcpy(&x, bits.data() + i, sizeof x);
    alignas(32) float y[8];
    _mm256_store_ps(y, exp8(x));
    for (size_t l = 0; l < 8; ++l) {
      const float xl = bits_to_float(bits[i + l]);
      const uint32_t want = float_to_bits(expf(xl));
      const uint32_t got = float_to_bits(y[l]);
      if (want != got) {
        if (bad < 5) {
          ADD_FAILURE() << "exp8(" << std::hexfloat << xl << ") bits 0x" << std::hex << got
                        << ", expf gives 0x" << want;
        }
        ++bad;
      }
    }
  }
  return bad;
}

TEST(CpuExp8, MatchesExpfOnASweepOfAllBitPatterns) {
  // Every 127th pattern of the 2^32, in batches, with a different lane order each time.
  constexpr uint64_t kStride = 127;
  std::vector<uint32_t> bits;
  bits.reserve(1 << 20);
  int64_t bad = 0;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += kStride) {
    bits.push_back(static_cast<uint32_t>(b));
    if (bits.size() == (1 << 20)) {
      bad += count_mismatches(bits);
      bits.clear();
    }
  }
  bits.resize(bits.size() / 8 * 8);
  bad += count_mismatches(bits);
  EXPECT_EQ(bad, 0);
}

TEST(CpuExp8, MatchesExpfEverywhereTheLibraryChangesPath) {
  // All patterns with |x| in [80, 110): the main path's last values, the overflow bound
  // (88.72), the underflow bounds (-103.28, -103.97) and the handover at |x| = 88.
  std::vector<uint32_t> bits;
  for (const uint32_t sign : {0u, 0x80000000u}) {
    for (uint32_t b = float_to_bits(80.0f); b < float_to_bits(110.0f); ++b)
      bits.push_back(sign | b);
  }
  bits.resize(bits.size() / 8 * 8);
  EXPECT_EQ(count_mismatches(bits), 0);
}

TEST(CpuExp8, MatchesExpfOnSpecialValues) {
  const float special[] = {0.0f,
                           -0.0f,
                           INFINITY,
                           -INFINITY,
                           std::numeric_limits<float>::denorm_min(),
                           -std::numeric_limits<float>::denorm_min(),
                           std::numeric_limits<float>::min(),
                           std::numeric_limits<float>::max(),
                           -std::numeric_limits<float>::max(),
                           0x1.62e42ep6f,
                           std::nextafter(0x1.62e42ep6f, INFINITY),
                           -0x1.9fe368p6f,
                           std::nextafter(-0x1.9fe368p6f, -INFINITY),
                           -0x1.9d1d9ep6f,
                           std::nextafter(-0x1.9d1d9ep6f, -INFINITY),
                           88.0f,
                           std::nextafter(88.0f, 0.0f),
                           -88.0f,
                           std::nextafter(-88.0f, 0.0f),
                           1e-30f,
                           -1e-30f,
                           1.0f,
                           -1.0f};
  std::vector<uint32_t> bits;
  for (const float x : special) bits.push_back(float_to_bits(x));
  // Quiet and signalling NaNs of both signs, with payloads.
  for (const uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0xFF812345u, 0x7FFFFFFFu}) {
    bits.push_back(nan);
  }
  // Each value in every lane, beside ordinary ones.
  std::vector<uint32_t> lanes;
  for (const uint32_t b : bits) {
    for (int lane = 0; lane < 8; ++lane) {
      for (int l = 0; l < 8; ++l) lanes.push_back(l == lane ? b : float_to_bits(-0.5f * l));
    }
  }
  EXPECT_EQ(count_mismatches(lanes), 0);
}

TEST(CpuExp8, SoftmaxExpRowIsSoftmaxExpPerElement) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 20.0f);
  for (int64_t n = 0; n <= 41; ++n) {
    std::vector<float> z(static_cast<size_t>(n) + 1);
    for (float& v : z) v = normal(rng);
    if (n > 3) z[2] = -INFINITY;
    if (n > 9) z[9] = NAN;
    const float row_max = normal(rng);
    std::vector<float> want = z;
    for (int64_t i = 0; i < n; ++i) want[i] = softmax_exp(z[i], row_max);
    softmax_exp_row(z.data(), n, row_max);
    for (int64_t i = 0; i <= n; ++i) {
      ASSERT_EQ(float_to_bits(z[i]), float_to_bits(want[i])) << "n " << n << ", element " << i;
    }
  }
}

// softmax_row_max is softmax_max's scan over the row: NaNs never win (a row of NaNs keeps
// -inf), -inf rows stay -inf, the maximum is found in any lane or in the tail, and nothing past
// n is read. Zeros of either sign compare by value only (the one freedom it takes).
TEST(CpuExp8, SoftmaxRowMaxIsTheScanOfSoftmaxMax) {
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
