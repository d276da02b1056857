// core/precision/block_scaling.h against independent references: the scale rules against
// exact arithmetic (products of FP32 values and small integers are exact in FP64) and
// brute-force searches over every power of two and every FP8 code, the scale-tensor layouts
// against the shapes cuBLASLt and PyTorch's scaled_mm document and against the properties a
// layout must have (every block's scale in its own slot, padding where the documentation
// pads).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <set>
#include <vector>

#include "core/precision/block_scaling.h"

namespace mantissa::core {
namespace {

// Magnitudes across the whole FP32 range, subnormals included, plus edge values.
std::vector<float> magnitudes(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> bits(1, 0x7F7FFFFFu);
  std::vector<float> out = {std::numeric_limits<float>::denorm_min(),
                            1e-45f,
                            1e-40f,
                            std::numeric_limits<float>::min(),
                            0.5f,
                            1.0f,
                            448.0f,
                            449.0f,
                            57344.0f,
                            3.0e38f,
                            std::numeric_limits<float>::max()};
  for (int i = 0; i < n; ++i) out.push_back(bits_to_float(bits(rng)));
  return out;
}

TEST(BlockScaling, PowerOfTwoAtLeastIsTheSmallestPowerNotBelow) {
  for (float s : magnitudes(20000, 1)) {
    if (s > 0x1p127f) continue;  // the next power would overflow; scales never get there
    const float p = pow2_at_least(s);
    int exponent = 0;
    EXPECT_EQ(std::frexp(static_cast<double>(p), &exponent), 0.5) << s << " -> " << p;
    EXPECT_GE(p, s);
    EXPECT_LT(static_cast<double>(p) / 2.0, static_cast<double>(s)) << s << " -> " << p;
  }
}

// s must be the FP32 value nearest to amax / fmt_max: |s * fmt_max - amax| (exact in FP64)
// no larger than for either neighbour of s.
void expect_nearest_quotient(float amax, float fmt_max, float s) {
  const auto error = [&](float candidate) {
    return std::fabs(static_cast<double>(candidate) * fmt_max - static_cast<double>(amax));
  };
  const float up = std::nextafter(s, INFINITY);
  const float down = std::nextafter(s, 0.0f);
  EXPECT_LE(error(s), error(up)) << amax << " / " << fmt_max << " -> " << s;
  EXPECT_LE(error(s), error(down)) << amax << " / " << fmt_max << " -> " << s;
}

// Brute force: the smallest power of two 2^e (e >= -149) with amax / 2^e <= fmt_max, exact
// in FP64.
float smallest_power_covering(float amax, float fmt_max) {
  for (int e = -149; e <= 127; ++e) {
    if (static_cast<double>(amax) / std::ldexp(1.0, e) <= fmt_max) return std::ldexp(1.0f, e);
  }
  return INFINITY;
}

TEST(BlockScaling, ScaleIsAmaxOverFormatMaxRoundedToNearest) {
  for (float fmt_max : {448.0f, 57344.0f}) {
    for (float amax : magnitudes(20000, 2)) {
      const float s = block_scale(amax, fmt_max, false);
      const double exact = static_cast<double>(amax) / fmt_max;
      if (exact < static_cast<double>(std::numeric_limits<float>::min())) {
        // A quotient below FP32's normal range takes the power-of-two rule.
        EXPECT_EQ(s, smallest_power_covering(amax, fmt_max)) << amax;
      } else {
        expect_nearest_quotient(amax, fmt_max, s);
      }
      EXPECT_LE(static_cast<double>(amax) / s, fmt_max * (1.0 + 1e-7)) << amax;
      // The sign of amax does not matter (it is a magnitude).
      EXPECT_EQ(block_scale(-amax, fmt_max, false), s);
    }
  }
}

TEST(BlockScaling, PowerOfTwoScaleIsTheSmallestThatDoesNotSaturate) {
  for (float fmt_max : {448.0f, 57344.0f}) {
    for (float amax : magnitudes(20000, 3)) {
      const float s = block_scale(amax, fmt_max, true);
      EXPECT_EQ(s, smallest_power_covering(amax, fmt_max)) << amax;
      // Dividing by a power of two is exact: the largest element lands in (fmt_max / 2,
      // fmt_max], unless s is already the smallest FP32.
      const double scaled = static_cast<double>(amax) / s;
      EXPECT_LE(scaled, fmt_max) << amax;
      if (s > std::numeric_limits<float>::denorm_min()) {
        EXPECT_GT(scaled, fmt_max / 2.0) << amax;
      }
    }
  }
}

TEST(BlockScaling, ZeroAndNonFiniteAmaxGiveScaleOne) {
  for (bool pow2 : {false, true}) {
    EXPECT_EQ(block_scale(0.0f, 448.0f, pow2), 1.0f);
    EXPECT_EQ(block_scale(-0.0f, 448.0f, pow2), 1.0f);
    EXPECT_EQ(block_scale(INFINITY, 448.0f, pow2), 1.0f);
    EXPECT_EQ(block_scale(NAN, 57344.0f, pow2), 1.0f);
  }
  EXPECT_EQ(mx_scale_e8m0(0.0f, 448.0f), 127);
  EXPECT_EQ(mx_scale_e8m0(INFINITY, 448.0f), 127);
  EXPECT_EQ(mx_scale_e8m0(NAN, 448.0f), 127);
}

TEST(BlockScaling, E8m0IsTheSmallestExponentCoveringTheScale) {
  for (uint32_t e = 0; e < 255; ++e) {
    EXPECT_EQ(e8m0_to_float(static_cast<uint8_t>(e)), std::ldexp(1.0f, static_cast<int>(e) - 127));
  }
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  for (float fmt_max : {448.0f, 57344.0f}) {
    // Random magnitudes, and every boundary: fmt_max 2^k and the floats beside it.
    std::vector<float> amaxes = magnitudes(5000, 4);
    for (int k = -160; k <= 128; ++k) {
      const float boundary = std::ldexp(fmt_max, k);
      if (boundary == 0.0f || !std::isfinite(boundary)) continue;
      for (float amax :
           {boundary, std::nextafter(boundary, 0.0f), std::nextafter(boundary, INFINITY)}) {
        if (amax > 0.0f && std::isfinite(amax)) amaxes.push_back(amax);
      }
    }
    for (float amax : amaxes) {
      const uint8_t got = mx_scale_e8m0(amax, fmt_max);
      // Brute force: the smallest E8M0 whose value keeps amax within fmt_max.
      int want = 254;
      for (int e = 0; e < 255; ++e) {
        if (static_cast<double>(amax) / e8m0_to_float(static_cast<uint8_t>(e)) <= fmt_max) {
          want = e;
          break;
        }
      }
      EXPECT_EQ(got, want) << amax;
      EXPECT_LE(static_cast<double>(amax) / e8m0_to_float(got), fmt_max) << amax;
    }
  }
}

// The FP8 code nearest to q (ties to the even code), by trying all 256 codes; saturating.
template <class Code>
uint8_t nearest_code(double q) {
  const float fmt_max = fp8_format_max<Code>();
  if (std::isnan(q)) return 0x7F;
  const double clamped = std::max<double>(-fmt_max, std::min<double>(fmt_max, q));
  int best = -1;
  double best_error = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const float v = to_float(Code{static_cast<uint8_t>(c)});
    if (!std::isfinite(v) || (v == 0.0f && std::signbit(v) != std::signbit(clamped))) continue;
    const double error = std::fabs(static_cast<double>(v) - clamped);
    const bool even = (c & 1) == 0;
    if (error < best_error || (error == best_error && even)) {
      best = c;
      best_error = error;
    }
  }
  return static_cast<uint8_t>(best);
}

template <class Code>
void check_codes_against_enumeration(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-30, 30);
  // The block's amax |x| 2^u, u in [0, 16): the quotient x / s = fmt_max 2^-u reaches every
  // binade of both formats, the top one (x at or near the amax) and the subnormals included.
  std::uniform_real_distribution<float> spread(0.0f, 16.0f);
  int mismatches = 0;
  for (int n = 0; n < 20000; ++n) {
    const float x = std::ldexp(normal(rng), exponent(rng));
    const float amax = std::fabs(x) * std::exp2(spread(rng));
    for (bool pow2 : {false, true}) {
      const float s = block_scale(amax, fp8_format_max<Code>(), pow2);
      const uint8_t got = quantize_with_scale<Code>(x, s).bits;
      // q = x / s in FP64 is exact to 53 bits; FP32 division rounds it once more, which can
      // only move a quotient within 2^-24 of a rounding midpoint: accept either neighbour
      // there.
      const double q = static_cast<double>(x) / s;
      const uint8_t want = nearest_code<Code>(q);
      if (got != want) {
        const double got_error = std::fabs(to_float(Code{got}) - q);
        const double want_error = std::fabs(to_float(Code{want}) - q);
        if (!(got_error <= want_error * (1.0 + 1e-6) + 1e-300) && ++mismatches <= 5) {
          ADD_FAILURE() << "x " << x << " s " << s << ": code " << int(got) << ", nearest "
                        << int(want);
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(BlockScaling, CodesAreTheNearestCodeOfTheQuotient) {
  check_codes_against_enumeration<fp8_e4m3>(5);
  check_codes_against_enumeration<fp8_e5m2>(6);
}

TEST(BlockScaling, BlockAmaxMapsToFormatMax) {
  for (float amax : magnitudes(2000, 7)) {
    if (amax < 1e-30f || amax > 1e30f) continue;
    const float s = block_scale(amax, 448.0f, false);
    EXPECT_EQ(to_float(quantize_with_scale<fp8_e4m3>(amax, s)), 448.0f) << amax;
    EXPECT_EQ(to_float(quantize_with_scale<fp8_e4m3>(-amax, s)), -448.0f) << amax;
  }
}

// ---------------------------------------------------------------------------------------
// Layouts.

constexpr ScaleMode kModes[] = {ScaleMode::kOuterVec, ScaleMode::kVec128, ScaleMode::kBlock128,
                                ScaleMode::kVec32Ue8m0};

// The sizes cuBLASLt's scale modes take, as PyTorch's scaled_mm checks them: 1x128 [M, L]
// with strides (1, M); 128x128 [round_up(L, 4), ceil(M / 128)] with strides (1, round_up(L,
// 4)); MXFP8 round_up(M, 128) * round_up(ceil(K / 32), 4) bytes; per row M.
int64_t documented_count(ScaleMode mode, int64_t outer, int64_t k) {
  const auto up = [](int64_t a, int64_t b) { return (a + b - 1) / b * b; };
  const auto blocks = [](int64_t a, int64_t b) { return (a + b - 1) / b; };
  switch (mode) {
    case ScaleMode::kOuterVec: return outer;
    case ScaleMode::kVec128: return outer * blocks(k, 128);
    case ScaleMode::kBlock128: return up(blocks(k, 128), 4) * blocks(outer, 128);
    case ScaleMode::kVec32Ue8m0: return up(outer, 128) * up(blocks(k, 32), 4);
    default: return 1;
  }
}

TEST(BlockScaling, LayoutsHaveTheDocumentedSizes) {
  for (ScaleMode mode : kModes) {
    for (int64_t outer : {1, 4, 100, 128, 130, 384, 2048}) {
      for (int64_t k : {16, 32, 96, 128, 200, 384, 1536}) {
        EXPECT_EQ(scale_count(mode, outer, k), documented_count(mode, outer, k))
            << scale_mode_name(mode) << " outer " << outer << " K " << k;
      }
    }
  }
}

TEST(BlockScaling, EveryBlockHasItsOwnSlotAndTheRestIsPadding) {
  for (ScaleMode mode : kModes) {
    for (int64_t outer : {4, 100, 128, 260}) {
      for (int64_t k : {32, 96, 128, 400}) {
        const int64_t count = scale_count(mode, outer, k);
        const int64_t block_rows = scale_block_rows(mode, outer);
        std::set<int64_t> slots;
        for (int64_t i = 0; i < outer; ++i) {
          for (int64_t b = 0; b < scale_k_blocks(mode, k); ++b) {
            const int64_t index = scale_index(mode, outer, k, i, b);
            ASSERT_GE(index, 0);
            ASSERT_LT(index, count) << scale_mode_name(mode);
            // Rows of one block share a slot; different blocks never do.
            if (i % block_rows == 0) {
              EXPECT_TRUE(slots.insert(index).second)
                  << scale_mode_name(mode) << " (" << i << ", " << b << ")";
            } else {
              EXPECT_EQ(index, scale_index(mode, outer, k, i - i % block_rows, b));
            }
          }
        }
        // Unpadded layouts use every slot.
        if (mode == ScaleMode::kOuterVec || mode == ScaleMode::kVec128) {
          EXPECT_EQ(static_cast<int64_t>(slots.size()), count);
        }
      }
    }
  }
}

TEST(BlockScaling, LayoutsMatchCublasLtsOrder) {
  // 1x128: the scales of one K-block are contiguous (outer-major).
  EXPECT_EQ(scale_index(ScaleMode::kVec128, 256, 384, 5, 0), 5);
  EXPECT_EQ(scale_index(ScaleMode::kVec128, 256, 384, 5, 2), 5 + 2 * 256);
  // 128x128: K-major, each row of blocks padded to 4 (K = 384: 3 blocks, stride 4).
  EXPECT_EQ(scale_index(ScaleMode::kBlock128, 512, 384, 0, 2), 2);
  EXPECT_EQ(scale_index(ScaleMode::kBlock128, 512, 384, 300, 1), 1 + 2 * 4);
  // MXFP8: 128x4 tiles of 512 bytes; row i + 32 is 4 bytes on, row i + 1 16 bytes on, block
  // b + 1 one byte on, the next tile along K 512 bytes on, the next along the rows
  // 512 * (tiles per row) on.
  const int64_t outer = 256, k = 512;  // 16 K-blocks: 4 tiles per row of tiles
  EXPECT_EQ(scale_index(ScaleMode::kVec32Ue8m0, outer, k, 0, 0), 0);
  EXPECT_EQ(scale_index(ScaleMode::kVec32Ue8m0, outer, k, 1, 0), 16);
  EXPECT_EQ(scale_index(ScaleMode::kVec32Ue8m0, outer, k, 32, 0), 4);
  EXPECT_EQ(scale_index(ScaleMode::kVec32Ue8m0, outer, k, 0, 1), 1);
  EXPECT_EQ(scale_index(ScaleMode::kVec32Ue8m0, outer, k, 0, 4), 512);
  EXPECT_EQ(scale_index(ScaleMode::kVec32Ue8m0, outer, k, 128, 0), 4 * 512);
  EXPECT_EQ(scale_index(ScaleMode::kVec32Ue8m0, outer, k, 127, 3), 31 * 16 + 3 * 4 + 3);
  // One tile is exactly 128 rows x 4 blocks, filling its 512 bytes.
  std::set<int64_t> tile;
  for (int64_t i = 0; i < 128; ++i) {
    for (int64_t b = 0; b < 4; ++b)
      tile.insert(scale_index(ScaleMode::kVec32Ue8m0, outer, k, i, b));
  }
  EXPECT_EQ(tile.size(), 512u);
  EXPECT_EQ(*tile.begin(), 0);
  EXPECT_EQ(*tile.rbegin(), 511);
}

TEST(BlockScaling, PairsAreCublasLts) {
  EXPECT_EQ(scale_mode_pair_rule(ScaleMode::kVec128, ScaleMode::kVec128), nullptr);
  EXPECT_EQ(scale_mode_pair_rule(ScaleMode::kVec128, ScaleMode::kBlock128), nullptr);
  EXPECT_EQ(scale_mode_pair_rule(ScaleMode::kBlock128, ScaleMode::kVec128), nullptr);
  EXPECT_EQ(scale_mode_pair_rule(ScaleMode::kOuterVec, ScaleMode::kOuterVec), nullptr);
  EXPECT_EQ(scale_mode_pair_rule(ScaleMode::kVec32Ue8m0, ScaleMode::kVec32Ue8m0), nullptr);
  EXPECT_NE(scale_mode_pair_rule(ScaleMode::kBlock128, ScaleMode::kBlock128), nullptr);
  EXPECT_NE(scale_mode_pair_rule(ScaleMode::kVec128, ScaleMode::kOuterVec), nullptr);
  EXPECT_NE(scale_mode_pair_rule(ScaleMode::kTensor, ScaleMode::kVec128), nullptr);
}

}  // namespace
}  // namespace mantissa::core
