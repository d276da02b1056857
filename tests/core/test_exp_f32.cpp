// exp_f32 (core/ops/math/exp_f32.h) against FP64's exp: within 1.03 ulp of the exact value on a
// dense sweep of every FP32 input where the result is finite and non-zero, inf and 0 beyond,
// and NaN, infinities and zero as exp has them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "core/dtype/dtype.h"
#include "core/ops/math/exp_f32.h"

namespace mantissa::core {
namespace {

// The error of y in units of the last place of the exact value e (a subnormal's ulp below the
// normal range). inf is exact beyond FLT_MAX; below it, inf counts as 2^128, the value the
// float range would round to next, so a result that overflows where e is just below FLT_MAX is
// off by an ulp, not infinitely.
double ulp_error(float y, double e) {
  if (std::isinf(y) && e > std::numeric_limits<float>::max()) return 0.0;
  const double ulp = e < 0x1p-126 ? 0x1p-149 : std::ldexp(1.0, std::ilogb(e) - 23);
  const double got = std::isinf(y) ? 0x1p128 : static_cast<double>(y);
  return std::fabs(got - e) / ulp;
}

TEST(ExpF32, IsWithin1Point03UlpOfFp64OnASweepOfAllInputs) {
  // Every 61st bit pattern of the 2^32: about 70 million inputs.
  constexpr uint64_t kStride = 61;
  double worst = 0.0;
  float worst_x = 0.0f;
  int64_t checked = 0;
  for (uint64_t b = 0; b < (uint64_t{1} << 32); b += kStride) {
    const float x = bits_to_float(static_cast<uint32_t>(b));
    if (!(x > -104.0f && x < 89.0f)) continue;  // the clamps' range; beyond it, the next test
    const double error = ulp_error(exp_f32(x), std::exp(static_cast<double>(x)));
    if (error > worst) {
      worst = error;
      worst_x = x;
    }
    ++checked;
  }
  EXPECT_GT(checked, 30'000'000);
  EXPECT_LE(worst, 1.03) << "at x = " << std::hexfloat << worst_x;
}

TEST(ExpF32, OverflowsToInfAndUnderflowsToZeroBeyondTheFloatRange) {
  // ln(FLT_MAX) = 88.7228...; below ln(2^-150) = -103.97 exp is under half the smallest
  // subnormal.
  for (const float x : {88.73f, 89.0f, 100.0f, 1e30f, std::numeric_limits<float>::max()}) {
    EXPECT_EQ(exp_f32(x), INFINITY) << x;
  }
  for (const float x : {-105.0f, -200.0f, -1e30f, -std::numeric_limits<float>::max()}) {
    EXPECT_EQ(exp_f32(x), 0.0f) << x;
  }
  // The last inputs with a finite, and a non-zero, result.
  EXPECT_LT(exp_f32(88.72f), INFINITY);
  EXPECT_GT(exp_f32(-103.2f), 0.0f);
}

TEST(ExpF32, SpecialValues) {
  EXPECT_EQ(exp_f32(INFINITY), INFINITY);
  EXPECT_EQ(exp_f32(-INFINITY), 0.0f);
  EXPECT_EQ(exp_f32(0.0f), 1.0f);
  EXPECT_EQ(exp_f32(-0.0f), 1.0f);
  // A NaN comes back as it went in, sign and payload included.
  for (const uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7FC12345u, 0xFFFFFFFFu}) {
    EXPECT_EQ(float_to_bits(exp_f32(bits_to_float(nan))), nan) << std::hex << nan;
  }
}

}  // namespace
}  // namespace mantissa::core
