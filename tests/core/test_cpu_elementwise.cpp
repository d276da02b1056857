// The CPU backend's conversions and elementwise ops against FP64 references: cast (every dtype
// pair, scales, fused amax, saturation, stochastic rounding, overlapping operands), amax,
// add_bias, bias_backward, add and GELU (its tails included). Inputs are stored in their dtype
// first and read back exactly, so every reference starts from the values the op really saw. Outputs
// are filled with NaN before each call, so an element the op forgot to write cannot pass.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/ops/backend.h"
#include "core/ops/math/gelu.h"
#include "tests/common/test_util.h"

namespace mantissa::core {
namespace {

// Spans several of the backend's work slices and is large enough for OpenMP to split.
constexpr int64_t kLarge = 70001;

// ---------------------------------------------------------------------------------------
// Element access beyond test_util.h's.

uint32_t encode_stochastic(DType d, float v, uint32_t random, Saturation sat) {
  switch (d) {
    case DType::kF32: return float_to_bits(Rounder<float>::stochastic(v, random, sat));
    case DType::kBF16: return Rounder<bf16>::stochastic(v, random, sat).bits;
    case DType::kF16: return Rounder<fp16>::stochastic(v, random, sat).bits;
    case DType::kE4M3: return Rounder<fp8_e4m3>::stochastic(v, random, sat).bits;
    case DType::kE5M2: return Rounder<fp8_e5m2>::stochastic(v, random, sat).bits;
    default: ADD_FAILURE() << "encode_stochastic: not a float dtype"; return 0;
  }
}

float scalar_of(const Tensor& t) {
  return t.data_as<float>()[0];
}

// Stores random values of either sign with magnitudes log-uniform in [2^lo, 2^hi], and a
// few zeros.
void fill_log_uniform(Tensor& t, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> exponent(lo, hi);
  std::uniform_int_distribution<int> coin(0, 31);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int c = coin(rng);
    const double magnitude = c == 0 ? 0.0 : std::exp2(exponent(rng));
    set_value(t, i, static_cast<float>(c % 2 ? -magnitude : magnitude));
  }
}

void fill_uniform(Tensor& t, std::mt19937& rng, double lo, double hi) {
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) set_value(t, i, static_cast<float>(dist(rng)));
}

class CpuElementwise : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::mt19937 rng{20240520};
};

// ---------------------------------------------------------------------------------------
// cast

// Every source dtype to every destination dtype, without a scale and with an exact and an
// inexact one. Each result must be (1) within half an ulp of the FP64 product src * scale,
// plus the one FP32 rounding of that product the contract allows, and (2) bit-identical to
// the scalar conversion of dtype.h applied to the FP32 product, which is what makes the CPU
// and GPU backends agree. The fused amax must equal max |src| exactly.
TEST_F(CpuElementwise, CastMatchesFp64ForEveryDtypePair) {
  for (DType src_type : kFloatTypes) {
    for (DType dst_type : kFloatTypes) {
      for (float scale : {1.0f, 0.125f, 0.37f}) {
        SCOPED_TRACE(std::string(dtype_name(src_type)) + " -> " + dtype_name(dst_type) +
                     ", scale " + std::to_string(scale));
        const Grid gs = grid_of(src_type);
        const Grid gd = grid_of(dst_type);
        // Sources span both formats' common normal range and a little of the subnormals
        // below it; with scales <= 1 the products stay finite in the destination.
        const double lo = std::max(gs.min_exp, gd.min_exp) - 2;
        const double hi = std::min(gs.max_exp, gd.max_exp) - 0.5;
        Tensor src = Tensor::empty(Shape{kLarge}, src_type);
        fill_log_uniform(src, rng, lo, hi);
        Tensor dst = Tensor::empty(Shape{kLarge}, dst_type);
        poison(dst);
        Tensor scale_t = f32_scalar(scale);
        Tensor amax = f32_scalar(NAN);
        CastParams params;
        params.scale = scale == 1.0f ? nullptr : &scale_t;
        params.amax = &amax;
        backend->cast(src, dst, params);

        int64_t failures = 0;
        for (int64_t i = 0; i < kLarge && failures < 5; ++i) {
          const double x = value_at(src, i);
          const double y = x * scale;
          const double got = value_at(dst, i);
          const double tolerance =
              half_ulp(dst_type, std::fabs(y) * (1 + 0x1p-23)) + std::fabs(y) * 0x1p-23;
          const uint32_t scalar =
              encode(dst_type, static_cast<float>(x) * scale, Saturation::kSatFinite);
          if (!(std::fabs(got - y) <= tolerance) || code_at(dst, i) != scalar) {
            ++failures;
            ADD_FAILURE() << "element " << i << ": src " << x << " * " << scale << " = " << y
                          << ", got " << got << " (code " << code_at(dst, i)
                          << ", scalar conversion gives " << scalar << ")";
          }
        }
        double expected_amax = 0.0;
        for (int64_t i = 0; i < kLarge; ++i) {
          expected_amax = std::max(expected_amax, std::fabs(value_at(src, i)));
        }
        EXPECT_EQ(scalar_of(amax), expected_amax);
      }
    }
  }
}

TEST_F(CpuElementwise, CastAmaxIsTakenBeforeScaling) {
  for (DType src_type : {DType::kF32, DType::kBF16}) {
    Tensor src = Tensor::empty(Shape{5}, src_type);
    const float values[] = {1.0f, -6.0f, 2.5f, 0.0f, -0.5f};
    for (int i = 0; i < 5; ++i) set_value(src, i, values[i]);
    Tensor dst = Tensor::empty(Shape{5}, DType::kE4M3);
    poison(dst);
    Tensor scale = f32_scalar(16.0f);
    Tensor amax = f32_scalar(NAN);
    CastParams params;
    params.scale = &scale;
    params.amax = &amax;
    backend->cast(src, dst, params);
    EXPECT_EQ(scalar_of(amax), 6.0f);
    for (int i = 0; i < 5; ++i) EXPECT_EQ(value_at(dst, i), values[i] * 16.0);
  }
}

// accumulate_amax: the amax becomes the larger of the one it holds and this cast's, a NaN
// larger than any number (a step's micro-batches, one amax for all of them).
TEST_F(CpuElementwise, CastAmaxAccumulates) {
  Tensor dst = Tensor::empty(Shape{2}, DType::kE4M3);
  Tensor amax = f32_scalar(3.0f);
  CastParams params;
  params.amax = &amax;
  params.accumulate_amax = true;
  const auto cast = [&](float a, float b) {
    Tensor src = Tensor::empty(Shape{2}, DType::kF32);
    set_value(src, 0, a);
    set_value(src, 1, b);
    backend->cast(src, dst, params);
    return scalar_of(amax);
  };
  EXPECT_EQ(cast(1.0f, -2.0f), 3.0f) << "smaller: the held amax stays";
  EXPECT_EQ(cast(-5.0f, 0.5f), 5.0f) << "larger: it replaces the held one";
  EXPECT_EQ(cast(INFINITY, 1.0f), INFINITY);
  EXPECT_TRUE(std::isnan(cast(NAN, 1.0f)));
  EXPECT_TRUE(std::isnan(cast(1.0f, 2.0f))) << "a NaN once held stays";
  params.accumulate_amax = false;
  EXPECT_EQ(cast(1.0f, 2.0f), 2.0f) << "without accumulate_amax: this cast's alone";
}

// A NaN anywhere (here in the last slice of a multi-slice array, and first) makes amax NaN,
// for the direct F32 path and the sliced path alike.
TEST_F(CpuElementwise, CastAmaxPropagatesNaN) {
  for (DType src_type : {DType::kF32, DType::kBF16, DType::kE4M3}) {
    for (int64_t nan_at : {kLarge - 1, int64_t{0}}) {
      Tensor src = Tensor::empty(Shape{kLarge}, src_type);
      fill_uniform(src, rng, -4.0, 4.0);
      poison(src);  // every element NaN ...
      for (int64_t i = 0; i < kLarge; ++i) {
        if (i != nan_at) set_value(src, i, 1.0f);  // ... but one
      }
      Tensor dst = Tensor::empty(Shape{kLarge}, DType::kBF16);
      Tensor amax = f32_scalar(0.0f);
      CastParams params;
      params.amax = &amax;
      backend->cast(src, dst, params);
      EXPECT_TRUE(std::isnan(scalar_of(amax))) << dtype_name(src_type) << " NaN at " << nan_at;
      EXPECT_TRUE(std::isnan(value_at(dst, nan_at)));
    }
  }
}

// Overflow: into FP8, SATFINITE clamps to +-max and NOSAT gives NaN (E4M3, which has no
// inf) or inf (E5M2); BF16 and F16 overflow to inf whatever the setting, like their hardware
// conversions. NaN stays NaN. The expected values follow from each format's largest value
// and last gap: a value overflows when it is past max + gap / 2, or exactly there when
// max's last mantissa bit is odd (ties go to even, which is then upward).
TEST_F(CpuElementwise, CastSaturation) {
  struct Format {
    DType type;
    double max;
    double last_gap;
    bool max_is_odd;
    bool has_inf;
    bool saturates;
  };
  const Format formats[] = {
      {DType::kE4M3, 448.0, 32.0, false, false, true},
      {DType::kE5M2, 57344.0, 8192.0, true, true, true},
      {DType::kF16, 65504.0, 32.0, true, true, false},
      {DType::kBF16, std::ldexp(255.0, 120), std::ldexp(1.0, 120), true, true, false}};
  const float inputs[] = {400.0f,   448.0f,    464.0f,   465.0f,
                          -465.0f,  500.0f,    57344.0f, 61439.0f,
                          61440.0f, 65504.0f,  65519.0f, 65520.0f,
                          -7.0e4f,  1.0e6f,    3.3e38f,  -std::numeric_limits<float>::max(),
                          INFINITY, -INFINITY, NAN};
  const int n = static_cast<int>(std::size(inputs));
  for (const Format& f : formats) {
    for (Saturation sat : {Saturation::kSatFinite, Saturation::kNoSat}) {
      Tensor src = Tensor::empty(Shape{n}, DType::kF32);
      for (int i = 0; i < n; ++i) set_value(src, i, inputs[i]);
      Tensor dst = Tensor::empty(Shape{n}, f.type);
      poison(dst);
      CastParams params;
      params.saturation = sat;
      backend->cast(src, dst, params);
      for (int i = 0; i < n; ++i) {
        SCOPED_TRACE(std::string(dtype_name(f.type)) +
                     (sat == Saturation::kSatFinite ? " satfinite " : " nosat ") +
                     std::to_string(inputs[i]));
        const double x = inputs[i];
        const double got = value_at(dst, i);
        if (std::isnan(x)) {
          EXPECT_TRUE(std::isnan(got));
          continue;
        }
        const double boundary = f.max + f.last_gap / 2;
        const bool overflows =
            std::fabs(x) > boundary || (std::fabs(x) == boundary && f.max_is_odd);
        if (!overflows) {
          EXPECT_LE(std::fabs(got - x), half_ulp(f.type, std::fabs(x)));
        } else if (f.saturates && sat == Saturation::kSatFinite) {
          EXPECT_EQ(got, std::copysign(f.max, x));
        } else if (f.has_inf) {
          EXPECT_EQ(got, std::copysign(INFINITY, x));
        } else {
          EXPECT_TRUE(std::isnan(got));
        }
      }
    }
  }
}

// Stochastic rounding: the same seed gives the same bits, another seed other bits.
TEST_F(CpuElementwise, CastStochasticIsDeterministicPerSeed) {
  for (DType src_type : {DType::kF32, DType::kBF16}) {
    for (DType dst_type : {DType::kBF16, DType::kE4M3, DType::kE5M2}) {
      if (src_type == dst_type) continue;
      Tensor src = Tensor::empty(Shape{kLarge}, src_type);
      fill_uniform(src, rng, -3.0, 3.0);
      Tensor first = Tensor::empty(Shape{kLarge}, dst_type);
      Tensor second = Tensor::empty(Shape{kLarge}, dst_type);
      Tensor other = Tensor::empty(Shape{kLarge}, dst_type);
      CastParams params;
      params.rounding = Rounding::kStochastic;
      params.seed = 1234;
      poison(first);
      backend->cast(src, first, params);
      poison(second);
      backend->cast(src, second, params);
      params.seed = 1235;
      poison(other);
      backend->cast(src, other, params);
      EXPECT_EQ(std::memcmp(first.data(), second.data(), first.nbytes()), 0);
      int64_t differ = 0;
      for (int64_t i = 0; i < kLarge; ++i) differ += code_at(first, i) != code_at(other, i);
      EXPECT_GT(differ, kLarge / 20) << dtype_name(src_type) << " -> " << dtype_name(dst_type);
    }
  }
}

// Element i must be rounded with random_u32(seed, i) whatever the slicing inside the
// backend and however many threads run, and always to one of the two neighbours of the
// exact product.
TEST_F(CpuElementwise, CastStochasticIsSliceAndThreadInvariant) {
  const uint64_t seed = 987654321;
  for (DType src_type : kFloatTypes) {
    for (DType dst_type : {DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2}) {
      SCOPED_TRACE(std::string(dtype_name(src_type)) + " -> " + dtype_name(dst_type));
      Tensor src = Tensor::empty(Shape{kLarge}, src_type);
      fill_uniform(src, rng, -6.0, 6.0);
      Tensor scale = f32_scalar(0.75f);
      CastParams params;
      params.scale = &scale;
      params.rounding = Rounding::kStochastic;
      params.seed = seed;
      std::vector<Tensor> results;
      for (int threads : {1, 2, 3}) {
        Tensor dst = Tensor::empty(Shape{kLarge}, dst_type);
        poison(dst);
        with_threads(threads, [&] { backend->cast(src, dst, params); });
        results.push_back(dst);
      }
      int64_t failures = 0;
      for (int64_t i = 0; i < kLarge && failures < 5; ++i) {
        const float product = static_cast<float>(value_at(src, i)) * 0.75f;
        const uint32_t expected =
            encode_stochastic(dst_type, product, random_u32(seed, i), Saturation::kSatFinite);
        const double y = value_at(src, i) * 0.75;
        for (const Tensor& dst : results) {
          const double got = value_at(dst, i);
          if (code_at(dst, i) != expected ||
              !(std::fabs(got - y) < 2 * half_ulp(dst_type, std::fabs(y)))) {
            ++failures;
            ADD_FAILURE() << "element " << i << ": " << y << " rounded to " << got;
          }
        }
      }
    }
  }
}

// Rounding x up with probability (x - lo) / (hi - lo) makes the mean of many roundings x.
TEST_F(CpuElementwise, CastStochasticIsUnbiased) {
  struct Case {
    DType type;
    float x;  // between two neighbours lo and hi of the format
    double lo;
    double hi;
  };
  const Case cases[] = {{DType::kBF16, 1.0f + 0x1p-9f, 1.0, 1.0 + 0x1p-7},
                        {DType::kE4M3, 1.0625f, 1.0, 1.125},
                        {DType::kE5M2, -2.2f, -2.5, -2.0}};
  const int64_t n = 1 << 16;
  for (const Case& c : cases) {
    Tensor src = Tensor::empty(Shape{n}, DType::kF32);
    for (int64_t i = 0; i < n; ++i) set_value(src, i, c.x);
    Tensor dst = Tensor::empty(Shape{n}, c.type);
    poison(dst);
    CastParams params;
    params.rounding = Rounding::kStochastic;
    params.seed = 77;
    backend->cast(src, dst, params);
    int64_t hi_count = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double got = value_at(dst, i);
      ASSERT_TRUE(got == c.lo || got == c.hi) << got;
      hi_count += got == c.hi;
    }
    const double p = (c.x - c.lo) / (c.hi - c.lo);
    const double sigma = std::sqrt(p * (1 - p) / n);
    EXPECT_NEAR(static_cast<double>(hi_count) / n, p, 6 * sigma) << dtype_name(c.type);
  }
}

TEST_F(CpuElementwise, CastRejectsBadOperands) {
  Tensor f32 = Tensor::empty(Shape{4}, DType::kF32);
  Tensor bf = Tensor::empty(Shape{4}, DType::kBF16);
  Tensor i32 = Tensor::empty(Shape{4}, DType::kI32);
  Tensor short_bf = Tensor::empty(Shape{3}, DType::kBF16);
  Tensor two = Tensor::empty(Shape{2}, DType::kF32);
  Tensor i64 = Tensor::empty(Shape{1}, DType::kI64);
  expect_error([&] { backend->cast(i32, bf, {}); }, {"cast", "src"});
  expect_error([&] { backend->cast(f32, i32, {}); }, {"cast", "dst"});
  expect_error([&] { backend->cast(f32, short_bf, {}); }, {"cast", "element count"});
  CastParams bad_scale;
  bad_scale.scale = &two;
  expect_error([&] { backend->cast(f32, bf, bad_scale); }, {"cast", "scale"});
  CastParams bad_amax;
  bad_amax.amax = &i64;
  expect_error([&] { backend->cast(f32, bf, bad_amax); }, {"cast", "amax"});
}

// An output that overlaps its input is refused unless it is the input itself, element for
// element (same start, same element width): any other overlap is a data race on the GPU, where
// some threads read bytes others already wrote, so the backends would differ. In place, and
// disjoint parts of one buffer, still work.
TEST_F(CpuElementwise, CastRefusesOverlapUnlessInPlace) {
  Tensor buffer = Tensor::empty(Shape{8}, DType::kF32);
  fill_log_uniform(buffer, rng, -10, 10);
  // The same bytes seen as 8 BF16 (the first half of buffer) and as 4 F16 after them.
  Tensor as_bf16 = Tensor::wrap(buffer.data(), Shape{8}, DType::kBF16);
  Tensor head_f32 = buffer.view(0, Shape{4});
  Tensor tail_f32 = buffer.view(2, Shape{4});
  const auto refused = [&](const Tensor& src, Tensor& dst) {
    expect_error([&] { backend->cast(src, dst, {}); },
                 {"cast", "dst", "overlaps src", "without aliasing it exactly"});
  };
  refused(buffer, as_bf16);  // same start, element widths 4 and 2
  refused(as_bf16, buffer);
  Tensor shifted = buffer.view(1, Shape{4});
  refused(head_f32, shifted);  // same width, shifted by one element
  refused(tail_f32, head_f32);
  Tensor bf16_over_tail =
      Tensor::wrap(static_cast<float*>(buffer.data()) + 2, Shape{4}, DType::kBF16);
  refused(head_f32, bf16_over_tail);  // starts inside src, narrower elements

  // In place, one width: F32 scaled, and BF16 rewritten as F16 over the same bytes.
  const std::vector<double> before = values_of(buffer);
  const Tensor two = f32_scalar(2.0f);
  CastParams scaled;
  scaled.scale = &two;
  backend->cast(buffer, buffer, scaled);
  for (int64_t i = 0; i < buffer.numel(); ++i) EXPECT_EQ(value_at(buffer, i), 2 * before[i]);
  Tensor halves = Tensor::wrap(buffer.data(), Shape{16}, DType::kBF16);
  fill_log_uniform(halves, rng, -10, 10);
  const std::vector<double> bf16_values = values_of(halves);
  Tensor as_f16 = Tensor::wrap(buffer.data(), Shape{16}, DType::kF16);
  backend->cast(halves, as_f16, {});
  for (int64_t i = 0; i < as_f16.numel(); ++i) {
    EXPECT_EQ(code_at(as_f16, i), encode(DType::kF16, static_cast<float>(bf16_values[i])));
  }

  // Disjoint parts of one buffer, of different widths: F32 [0, 2) into BF16 over F32 [4, 5).
  fill_log_uniform(buffer, rng, -10, 10);
  const Tensor src = buffer.view(0, Shape{2});
  Tensor dst = Tensor::wrap(static_cast<float*>(buffer.data()) + 4, Shape{2}, DType::kBF16);
  backend->cast(src, dst, {});
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(code_at(dst, i), encode(DType::kBF16, static_cast<float>(value_at(src, i))));
  }
}

// ---------------------------------------------------------------------------------------
// copy

// Bytes move exactly; a copy onto itself is a no-op; partly overlapping ranges are refused on
// every backend (a device-to-device cudaMemcpy of them is undefined).
TEST_F(CpuElementwise, CopyIsExactAndRefusesOverlappingRanges) {
  Tensor src = Tensor::empty(Shape{6}, DType::kBF16);
  fill_log_uniform(src, rng, -20, 20);
  Tensor dst = Tensor::empty(Shape{6}, DType::kBF16);
  backend->copy(src, dst);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.nbytes()), 0);
  backend->copy(dst, dst);
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), src.nbytes()), 0);
  Tensor head = dst.view(0, Shape{4});
  Tensor tail = dst.view(2, Shape{4});
  expect_error([&] { backend->copy(head, tail); }, {"copy", "dst", "overlaps src"});
  expect_error([&] { backend->copy(src, head); }, {"copy", "element count"});
}

// ---------------------------------------------------------------------------------------
// amax

TEST_F(CpuElementwise, AmaxMatchesFp64) {
  for (DType type : kFloatTypes) {
    Tensor x = Tensor::empty(Shape{kLarge}, type);
    fill_uniform(x, rng, -100.0, 100.0);
    Tensor out = f32_scalar(NAN);
    backend->amax(x, out);
    double expected = 0.0;
    for (double v : values_of(x)) expected = std::max(expected, std::fabs(v));
    EXPECT_EQ(scalar_of(out), expected) << dtype_name(type);

    // The largest magnitude negative, then infinite, then a NaN in the last element.
    set_value(x, kLarge / 3, -400.0f);
    backend->amax(x, out);
    EXPECT_EQ(scalar_of(out), value_at(x, kLarge / 3) * -1) << dtype_name(type);
    if (type == DType::kE4M3) {
      set_code(x, kLarge - 1, 0xFF);  // E4M3 has no inf: -NaN
    } else {
      set_value(x, kLarge / 2, -INFINITY);
      backend->amax(x, out);
      EXPECT_EQ(scalar_of(out), INFINITY) << dtype_name(type);
      set_value(x, kLarge - 1, NAN);
    }
    backend->amax(x, out);
    EXPECT_TRUE(std::isnan(scalar_of(out))) << dtype_name(type);
  }
  Tensor empty = Tensor::empty(Shape{0}, DType::kF32);
  Tensor out = f32_scalar(NAN);
  backend->amax(empty, out);
  EXPECT_EQ(scalar_of(out), 0.0f);
  Tensor ints = Tensor::empty(Shape{3}, DType::kI32);
  Tensor x = Tensor::empty(Shape{3}, DType::kF32);
  Tensor wide = Tensor::empty(Shape{2}, DType::kF32);
  expect_error([&] { backend->amax(ints, out); }, {"amax", "x"});
  expect_error([&] { backend->amax(x, wide); }, {"amax", "out"});
}

// ---------------------------------------------------------------------------------------
// bias

// An op with one rounding: FP32 arithmetic (exact inputs) then one rounding to the storage
// dtype, so the error is at most half an ulp of the storage dtype plus one FP32 rounding.
double one_rounding_tolerance(DType type, double ref) {
  return half_ulp(type, std::fabs(ref) * (1 + 0x1p-23)) + std::fabs(ref) * 0x1p-23;
}

TEST_F(CpuElementwise, AddBiasMatchesFp64) {
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{300, 257}, {1, 5}, {7, 1}}) {
      Tensor x = Tensor::empty(Shape{rows, cols}, type);
      fill_uniform(x, rng, -4.0, 4.0);
      Tensor bias = Tensor::empty(Shape{cols}, DType::kF32);
      fill_uniform(bias, rng, -2.0, 2.0);
      const std::vector<double> x0 = values_of(x);
      backend->add_bias(x, bias);
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const double ref = x0[r * cols + c] + value_at(bias, c);
          const double got = value_at(x, r * cols + c);
          ASSERT_LE(std::fabs(got - ref), one_rounding_tolerance(type, ref))
              << dtype_name(type) << " [" << r << ", " << c << "]";
        }
      }
    }
  }
  Tensor x = Tensor::empty(Shape{4, 3}, DType::kF32);
  Tensor bias4 = Tensor::empty(Shape{4}, DType::kF32);
  Tensor bias_e4 = Tensor::empty(Shape{3}, DType::kE4M3);
  Tensor x1 = Tensor::empty(Shape{12}, DType::kF32);
  Tensor bias = Tensor::empty(Shape{3}, DType::kF32);
  Tensor x_e5 = Tensor::empty(Shape{4, 3}, DType::kE5M2);
  expect_error([&] { backend->add_bias(x, bias4); }, {"add_bias", "bias"});
  expect_error([&] { backend->add_bias(x, bias_e4); }, {"add_bias", "bias"});
  expect_error([&] { backend->add_bias(x1, bias); }, {"add_bias", "x"});
  expect_error([&] { backend->add_bias(x_e5, bias); }, {"add_bias", "x"});
}

// bias_backward is the derivative of add_bias: for L(b) = sum dout * add_bias(x, b), computed
// in FP64 from the backend's FP32 forward, (L(b + h e_c) - L(b - h e_c)) / 2h is dbias[c].
// add_bias is linear, so the difference is exact up to the forward's rounding of x + b, one
// half ulp per element, summed over the column: that is the tolerance.
TEST_F(CpuElementwise, BiasBackwardIsTheFiniteDifferenceOfAddBias) {
  constexpr int64_t kRows = 300, kCols = 7;
  constexpr double kStep = 0.25;
  Tensor x = Tensor::empty(Shape{kRows, kCols}, DType::kF32);
  Tensor dout = Tensor::empty(Shape{kRows, kCols}, DType::kF32);
  Tensor bias = Tensor::empty(Shape{kCols}, DType::kF32);
  fill_uniform(x, rng, -2.0, 2.0);
  fill_uniform(dout, rng, -1.0, 1.0);
  fill_uniform(bias, rng, -1.0, 1.0);
  const auto loss = [&](int64_t c, double shift) {
    Tensor out = Tensor::empty(x.shape(), DType::kF32);
    std::memcpy(out.data(), x.data(), x.nbytes());
    Tensor b = Tensor::empty(bias.shape(), DType::kF32);
    std::memcpy(b.data(), bias.data(), bias.nbytes());
    b.data_as<float>()[c] += static_cast<float>(shift);
    backend->add_bias(out, b);
    double sum = 0.0;
    for (int64_t i = 0; i < out.numel(); ++i) sum += value_at(dout, i) * value_at(out, i);
    return sum;
  };
  Tensor dbias = Tensor::empty(Shape{kCols}, DType::kF32);
  std::memset(dbias.data(), 0, dbias.nbytes());
  backend->bias_backward(dout, dbias);
  for (int64_t c = 0; c < kCols; ++c) {
    const double numeric = (loss(c, kStep) - loss(c, -kStep)) / (2 * kStep);
    double rounding = 0.0;  // both forwards' half ulps, weighted by |dout|, over the step
    for (int64_t r = 0; r < kRows; ++r) rounding += std::fabs(value_at(dout, r * kCols + c));
    const double tolerance = 2 * rounding * 0x1p-24 * 4.0 / (2 * kStep) + 1e-6;
    EXPECT_NEAR(value_at(dbias, c), numeric, tolerance) << "column " << c;
  }
}

// dbias += column sums in FP32: the error of an FP32 sum is bounded relative to the sum of
// the magnitudes, so that is what the tolerance scales with.
TEST_F(CpuElementwise, BiasBackwardMatchesFp64AndAccumulates) {
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [rows, cols] :
         {std::pair<int64_t, int64_t>{1000, 67}, {3, 5000}, {1, 1}, {0, 4}}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " rows " + std::to_string(rows) + " cols " +
                   std::to_string(cols));
      Tensor dout = Tensor::empty(Shape{rows, cols}, type);
      fill_uniform(dout, rng, -1.0, 1.0);
      Tensor dbias = Tensor::empty(Shape{cols}, DType::kF32);
      fill_uniform(dbias, rng, -5.0, 5.0);
      const std::vector<double> dbias0 = values_of(dbias);
      std::vector<Tensor> results;
      for (int threads : {1, 2, 3}) {
        Tensor d = Tensor::empty(Shape{cols}, DType::kF32);
        std::memcpy(d.data(), dbias.data(), dbias.nbytes());
        with_threads(threads, [&] { backend->bias_backward(dout, d); });
        results.push_back(d);
      }
      for (int64_t c = 0; c < cols; ++c) {
        double ref = dbias0[c];
        double magnitude = std::fabs(dbias0[c]);
        for (int64_t r = 0; r < rows; ++r) {
          ref += value_at(dout, r * cols + c);
          magnitude += std::fabs(value_at(dout, r * cols + c));
        }
        ASSERT_LE(std::fabs(value_at(results[0], c) - ref), 1e-5 * magnitude) << "column " << c;
      }
      // The same bits for any thread count.
      for (const Tensor& d : results) {
        EXPECT_EQ(std::memcmp(d.data(), results[0].data(), d.nbytes()), 0);
      }
    }
  }
  Tensor dout = Tensor::empty(Shape{4, 3}, DType::kF32);
  Tensor dbias4 = Tensor::empty(Shape{4}, DType::kF32);
  Tensor dbias_bf = Tensor::empty(Shape{3}, DType::kBF16);
  Tensor dout_e4 = Tensor::empty(Shape{4, 3}, DType::kE4M3);
  Tensor dbias = Tensor::empty(Shape{3}, DType::kF32);
  expect_error([&] { backend->bias_backward(dout, dbias4); }, {"bias_backward", "dbias"});
  expect_error([&] { backend->bias_backward(dout, dbias_bf); }, {"bias_backward", "dbias"});
  expect_error([&] { backend->bias_backward(dout_e4, dbias); }, {"bias_backward", "dout"});
}

// ---------------------------------------------------------------------------------------
// residual add

TEST_F(CpuElementwise, AddMatchesFp64WithAndWithoutAliasing) {
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor a = Tensor::empty(Shape{513, 129}, type);
    Tensor b = Tensor::empty(Shape{513, 129}, type);
    fill_uniform(a, rng, -8.0, 8.0);
    fill_uniform(b, rng, -8.0, 8.0);
    const std::vector<double> va = values_of(a);
    const std::vector<double> vb = values_of(b);
    auto check = [&](const Tensor& out, const std::vector<double>& x, const std::vector<double>& y,
                     const char* what) {
      for (int64_t i = 0; i < out.numel(); ++i) {
        const double ref = x[i] + y[i];
        ASSERT_LE(std::fabs(value_at(out, i) - ref), one_rounding_tolerance(type, ref))
            << dtype_name(type) << " " << what << " element " << i;
      }
    };
    Tensor out = Tensor::empty(a.shape(), type);
    poison(out);
    backend->add(a, b, out);
    check(out, va, vb, "out = a + b");

    Tensor a2 = Tensor::empty(a.shape(), type);
    std::memcpy(a2.data(), a.data(), a.nbytes());
    backend->add(a2, b, a2);
    check(a2, va, vb, "a += b");

    Tensor b2 = Tensor::empty(b.shape(), type);
    std::memcpy(b2.data(), b.data(), b.nbytes());
    backend->add(a, b2, b2);
    check(b2, va, vb, "b += a");

    Tensor c = Tensor::empty(a.shape(), type);
    std::memcpy(c.data(), a.data(), a.nbytes());
    backend->add(c, c, c);
    check(c, va, va, "c = c + c");
  }
  Tensor f32 = Tensor::empty(Shape{4}, DType::kF32);
  Tensor bf = Tensor::empty(Shape{4}, DType::kBF16);
  Tensor f32_5 = Tensor::empty(Shape{5}, DType::kF32);
  Tensor e4 = Tensor::empty(Shape{4}, DType::kE4M3);
  expect_error([&] { backend->add(f32, bf, f32); }, {"add", "b"});
  expect_error([&] { backend->add(f32, f32, bf); }, {"add", "out"});
  expect_error([&] { backend->add(f32, f32_5, f32); }, {"add", "b"});
  expect_error([&] { backend->add(e4, e4, e4); }, {"add", "a"});
}

// ---------------------------------------------------------------------------------------
// GELU

constexpr double kSqrt2OverPi = 0.79788456080286535588;

// GELU in FP64. 0.5 x (1 + tanh(u)) cancels catastrophically for u << 0 even in FP64, so
// there it uses the identity 0.5 (1 + tanh(u)) = exp(2u) / (1 + exp(2u)).
double gelu_fp64(double x) {
  const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
  if (u > -1.0) return 0.5 * x * (1.0 + std::tanh(u));
  const double e = std::exp(2.0 * u);
  return x * e / (1.0 + e);
}

// Central difference of the FP64 GELU; the step is small enough that the truncation error
// (h^2 |gelu'''| / 6, about 1e-11) and the cancellation error (1e-16 / h) are far below
// the tolerances used.
double gelu_grad_fd(double x) {
  const double h = 1e-5 * std::max(1.0, std::fabs(x));
  return (gelu_fp64(x + h) - gelu_fp64(x - h)) / (2 * h);
}

// Inputs: uniform in [-8, 8], plus the interesting points.
Tensor gelu_inputs(DType type, std::mt19937& rng) {
  const float special[] = {0.0f,  -0.0f,  1e-30f, -1e-30f, 1e-3f, -1e-3f, -0.7518f, 1.0f,
                           -1.0f, 3.0f,   -3.0f,  9.0f,    -9.0f, -10.5f, 12.0f,    -12.0f,
                           30.0f, -30.0f, 1e5f,   -1e5f,   1e30f, -1e30f};
  Tensor x = Tensor::empty(Shape{kLarge}, type);
  fill_uniform(x, rng, -8.0, 8.0);
  for (size_t i = 0; i < std::size(special); ++i) {
    const auto at = static_cast<int64_t>(i);
    set_value(x, at, special[i]);
    if (!std::isfinite(value_at(x, at))) set_value(x, at, 0.0f);  // past F16's range
  }
  return x;
}

// The relative error an FP32 evaluation of GELU cannot avoid is the condition number
// |x gelu'(x) / gelu(x)| (large in the far negative tail, where gelu is tiny and steep in
// relative terms) times a few FP32 roundings of the input-dependent terms. Where the sigmoid
// factor falls into the FP32 subnormals (x < -10), its absolute precision of about 2^-149
// times |x| adds to that.
double gelu_condition(double x) {
  const double g = gelu_fp64(x);
  return g == 0.0 ? 0.0 : std::fabs(x * gelu_grad_fd(x) / g);
}

TEST_F(CpuElementwise, GeluForwardMatchesFp64) {
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor x = gelu_inputs(type, rng);
    Tensor out = Tensor::empty(x.shape(), type);
    poison(out);
    backend->gelu_forward(x, out);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double xi = value_at(x, i);
      const double ref = gelu_fp64(xi);
      const double tolerance = (1e-5 + 8 * gelu_condition(xi) * 0x1p-24) * std::fabs(ref) +
                               half_ulp(type, std::fabs(ref)) + std::fabs(xi) * 0x1p-148;
      ASSERT_LE(std::fabs(value_at(out, i) - ref), tolerance)
          << dtype_name(type) << " gelu(" << xi << ") = " << ref << ", got " << value_at(out, i);
    }
  }
}

// dx = dout * gelu'(x) against the finite-difference derivative of the FP64 GELU. gelu'
// crosses zero near x = -0.75 as the sum of two terms of size about 0.2, so the tolerance
// has an absolute part (relative to those terms) besides the relative one.
TEST_F(CpuElementwise, GeluBackwardMatchesFiniteDifferences) {
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor x = gelu_inputs(type, rng);
    Tensor dout = Tensor::empty(x.shape(), type);
    fill_uniform(dout, rng, -2.0, 2.0);
    Tensor dx = Tensor::empty(x.shape(), type);
    poison(dx);
    backend->gelu_backward(x, dout, dx);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double xi = value_at(x, i);
      const double d = value_at(dout, i);
      const double ref = d * gelu_grad_fd(xi);
      const double tolerance =
          1e-5 * std::fabs(ref) + half_ulp(type, std::fabs(ref)) + 5e-7 * std::fabs(d);
      ASSERT_LE(std::fabs(value_at(dx, i) - ref), tolerance)
          << dtype_name(type) << " x " << xi << " dout " << d << ": expected " << ref << ", got "
          << value_at(dx, i);
    }
    // dx may overwrite dout in place.
    const std::vector<double> expected = values_of(dx);
    backend->gelu_backward(x, dout, dout);
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(value_at(dout, i), expected[i]);
  }
}

// gelu'(x) in FP64 from its closed form, with s = sigmoid(2u) and du = du/dx:
//   gelu'(x) = s + 2 x s (1 - s) du.
// Also returns |s| + |2 x s (1 - s) du|, the size of the terms, for a tolerance.
double gelu_grad_fp64(double x, double* term_size) {
  const double u = kSqrt2OverPi * (x + 0.044715 * x * x * x);
  const double e = std::exp(-2.0 * std::fabs(u));
  const double t = 1.0 / (1.0 + e);
  const double s = u >= 0.0 ? t : e * t;
  const double tail = 2.0 * x * (e * t * t) * kSqrt2OverPi * (1.0 + 3.0 * 0.044715 * x * x);
  *term_size = std::fabs(s) + std::fabs(tail);
  return s + tail;
}

// The tails of GELU, densely: x over [-30, 30] in F32, where sigmoid(2u) runs from 1 down
// through the FP32 subnormals to 0 (|u| up to about 1000), forward and backward against FP64.
// The errors allowed are a few FP32 roundings times the condition numbers (gelu's for the
// forward, 1 + 2|u| for exp(-2|u|) in the backward), plus the absolute precision of the
// subnormals (|x| 2^-148); past |x| = 10 the clamped derivative must stay within 1e-35 of the
// true one, and the non-finite inputs behave as documented in core/ops/math/gelu.h.
TEST_F(CpuElementwise, GeluTailsMatchFp64) {
  const int64_t n = 600001;
  Tensor x = Tensor::empty(Shape{n + 3}, DType::kF32);
  for (int64_t i = 0; i < n; ++i) {
    set_value(x, i, static_cast<float>(-30.0 + 60.0 * static_cast<double>(i) / (n - 1)));
  }
  set_value(x, n, INFINITY);
  set_value(x, n + 1, -INFINITY);
  set_value(x, n + 2, NAN);
  Tensor ones = Tensor::empty(x.shape(), DType::kF32);
  backend->fill(ones, 1.0f);
  Tensor out = Tensor::empty(x.shape(), DType::kF32);
  Tensor dx = Tensor::empty(x.shape(), DType::kF32);
  poison(out);
  poison(dx);
  backend->gelu_forward(x, out);
  backend->gelu_backward(x, ones, dx);
  for (int64_t i = 0; i < n; ++i) {
    const double xi = value_at(x, i);
    const double ref = gelu_fp64(xi);
    const double tolerance =
        8 * (1 + gelu_condition(xi)) * 0x1p-24 * std::fabs(ref) + std::fabs(xi) * 0x1p-148;
    ASSERT_LE(std::fabs(value_at(out, i) - ref), tolerance)
        << "gelu(" << xi << ") = " << ref << ", got " << value_at(out, i);
    double term_size = 0.0;
    const double grad_ref = gelu_grad_fp64(xi, &term_size);
    const double u = kSqrt2OverPi * (xi + 0.044715 * xi * xi * xi);
    const double grad_tolerance =
        std::fabs(xi) <= 10.0 ? 8 * (1 + 2 * std::fabs(u)) * 0x1p-24 * term_size : 1e-35;
    ASSERT_LE(std::fabs(value_at(dx, i) - grad_ref), grad_tolerance)
        << "gelu'(" << xi << ") = " << grad_ref << ", got " << value_at(dx, i);
  }
  EXPECT_EQ(value_at(out, n), INFINITY);
  EXPECT_TRUE(std::isnan(value_at(out, n + 1)));  // -inf * sigmoid(-inf) = -inf * 0
  EXPECT_TRUE(std::isnan(value_at(out, n + 2)));
  EXPECT_EQ(value_at(dx, n), 1.0);
  EXPECT_LE(std::fabs(value_at(dx, n + 1)), 1e-35);
  EXPECT_TRUE(std::isnan(value_at(dx, n + 2)));
}

// The GELU loops run sixteen lanes on CPUs with AVX-512 and eight otherwise
// (MANTISSA_CPU_AVX512_CONVERT=0, under which ctest runs this file too); either must be the
// scalar formula of core/ops/math/gelu.h bit for bit (the CUDA kernels evaluate it too, and
// test_gpu_ops compares their bits with the CPU's). Every BF16 and F16 value, and every 4096th
// FP32 bit pattern, forward and backward (dout cycling through values of both signs). This
// file is built for the baseline target, with no FMA instructions, and the backend for
// x86-64-v3: the formula's fused multiply-adds are explicit, so the two give the same bits. An
// FP32 NaN result need only be a NaN: which NaN payload a multiply or FMA passes on depends on
// its operand order, which the compiler chooses (rounding to 16 bits makes every NaN the same
// pattern).
template <class T>
void expect_gelu_is_the_scalar_formula(Backend& backend, DType type, int64_t n,
                                       uint32_t (*code_of)(int64_t)) {
  Tensor x = Tensor::empty(Shape{n}, type);
  Tensor dout = Tensor::empty(Shape{n}, type);
  for (int64_t i = 0; i < n; ++i) {
    set_code(x, i, code_of(i));
    set_value(dout, i, static_cast<float>(i % 7 - 3) * 0.375f);
  }
  Tensor out = Tensor::empty(x.shape(), type);
  Tensor dx = Tensor::empty(x.shape(), type);
  poison(out);
  poison(dx);
  backend.gelu_forward(x, out);
  backend.gelu_backward(x, dout, dx);
  const T* xs = x.data_as<const T>();
  const T* ds = dout.data_as<const T>();
  const auto same = [](const T& want, const T& got) {
    if constexpr (std::is_same_v<T, float>) {
      if (std::isnan(want)) return std::isnan(got);
    }
    return std::memcmp(&want, &got, sizeof(T)) == 0;
  };
  int failures = 0;
  for (int64_t i = 0; i < n && failures < 5; ++i) {
    const T forward = round_to<T>(gelu(to_float(xs[i])));
    const T backward = round_to<T>(to_float(ds[i]) * gelu_grad(to_float(xs[i])));
    if (!same(forward, out.data_as<const T>()[i]) || !same(backward, dx.data_as<const T>()[i])) {
      ADD_FAILURE() << dtype_name(type) << " x = " << to_float(xs[i]) << " (code " << code_of(i)
                    << "), dout = " << to_float(ds[i]) << ": gelu " << value_at(out, i)
                    << ", gelu' dout " << value_at(dx, i) << " where the scalar formula gives "
                    << to_float(forward) << " and " << to_float(backward);
      ++failures;
    }
  }
}

TEST_F(CpuElementwise, GeluIsTheScalarFormulaBitForBit) {
  const auto every_16_bit = [](int64_t i) { return static_cast<uint32_t>(i); };
  expect_gelu_is_the_scalar_formula<bf16>(*backend, DType::kBF16, 1 << 16, every_16_bit);
  expect_gelu_is_the_scalar_formula<fp16>(*backend, DType::kF16, 1 << 16, every_16_bit);
  expect_gelu_is_the_scalar_formula<float>(*backend, DType::kF32, 1 << 20, [](int64_t i) {
    return static_cast<uint32_t>(i) << 12 | static_cast<uint32_t>(i % 4096);
  });
}

// fill rounds the value once to the dtype (nearest even) and writes that pattern everywhere,
// an odd count included.
TEST_F(CpuElementwise, FillWritesTheRoundedValueToEveryElement) {
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2}) {
    for (float v : {0.0f, -0.0f, 0.1f, -3.25f, 1.0f / 3.0f}) {
      Tensor t = Tensor::empty(Shape{1001}, type);
      poison(t);
      backend->fill(t, v);
      const uint64_t want = encode(type, v);
      for (int64_t i = 0; i < t.numel(); ++i) {
        ASSERT_EQ(code_at(t, i), want) << dtype_name(type) << " fill(" << v << ") element " << i;
      }
    }
  }
}

TEST_F(CpuElementwise, GeluPropagatesNaN) {
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    Tensor x = Tensor::empty(Shape{3}, type);
    set_value(x, 0, 1.0f);
    set_value(x, 1, NAN);
    set_value(x, 2, -1.0f);
    Tensor dout = Tensor::empty(Shape{3}, type);
    for (int i = 0; i < 3; ++i) set_value(dout, i, 1.0f);
    Tensor out = Tensor::empty(Shape{3}, type);
    poison(out);
    backend->gelu_forward(x, out);
    EXPECT_TRUE(std::isnan(value_at(out, 1)));
    EXPECT_FALSE(std::isnan(value_at(out, 0)) || std::isnan(value_at(out, 2)));
    poison(out);
    backend->gelu_backward(x, dout, out);
    EXPECT_TRUE(std::isnan(value_at(out, 1)));
    EXPECT_FALSE(std::isnan(value_at(out, 0)) || std::isnan(value_at(out, 2)));
  }
}

// A bad switch stops the backend's construction with its own message, on the calling
// thread: read first inside an op's OpenMP region, it would end the process instead.
TEST(CpuBackendSwitches, ABadValueIsRefusedWhenTheBackendIsMade) {
  for (const char* variable :
       {"MANTISSA_CPU_BF16_GEMM", "MANTISSA_CPU_AVX512_CONVERT", "MANTISSA_CPU_AMX"}) {
    ScopedEnv bad(variable, "yes");
    expect_error([] { make_cpu_backend(); },
                 {variable, "=yes: must be 0 (off) or 1 (on, the default)"});
  }
}

TEST_F(CpuElementwise, GeluRejectsBadOperands) {
  Tensor f32 = Tensor::empty(Shape{4}, DType::kF32);
  Tensor bf = Tensor::empty(Shape{4}, DType::kBF16);
  Tensor f32_5 = Tensor::empty(Shape{5}, DType::kF32);
  Tensor e5 = Tensor::empty(Shape{4}, DType::kE5M2);
  expect_error([&] { backend->gelu_forward(f32, bf); }, {"gelu_forward", "out"});
  expect_error([&] { backend->gelu_forward(f32, f32_5); }, {"gelu_forward", "out"});
  expect_error([&] { backend->gelu_forward(e5, e5); }, {"gelu_forward", "x"});
  expect_error([&] { backend->gelu_backward(f32, bf, f32); }, {"gelu_backward", "dout"});
  expect_error([&] { backend->gelu_backward(f32, f32, f32_5); }, {"gelu_backward", "dx"});
}

// An output over its input shifted by an element would read values already overwritten (and
// race on the GPU): refused, as cast refuses it. Exactly in place is allowed.
TEST_F(CpuElementwise, AddAndGeluRefuseAnOutputThatPartlyOverlapsAnInput) {
  Tensor buffer = Tensor::empty(Shape{65}, DType::kF32);
  fill_uniform(buffer, rng, -1.0, 1.0);
  Tensor head = buffer.view(0, Shape{64});
  Tensor tail = buffer.view(1, Shape{64});
  Tensor other = Tensor::empty(Shape{64}, DType::kF32);
  fill_uniform(other, rng, -1.0, 1.0);
  expect_error([&] { backend->add(head, other, tail); }, {"add", "out", "overlaps a", "partly"});
  expect_error([&] { backend->add(other, head, tail); }, {"add", "out", "overlaps b", "partly"});
  expect_error([&] { backend->gelu_forward(head, tail); },
               {"gelu_forward", "out", "overlaps x", "partly"});
  expect_error([&] { backend->gelu_backward(head, other, tail); },
               {"gelu_backward", "dx", "overlaps x", "partly"});
  expect_error([&] { backend->gelu_backward(other, head, tail); },
               {"gelu_backward", "dx", "overlaps dout", "partly"});
  backend->add(head, other, head);
  backend->gelu_forward(head, head);
  backend->gelu_backward(other, head, head);
}

}  // namespace
}  // namespace mantissa::core
