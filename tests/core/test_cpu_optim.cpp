// The CPU backend's optimizer-side ops against FP64 references: AdamW over several steps
// (bias correction, decoupled weight decay, grad_scale, BF16 gradients, compute copies, ranges
// of a flat buffer), sum_squares, and the fused unscale + non-finite check. Inputs are stored in
// their dtype first and read back exactly; outputs are filled with NaN (or a sentinel) before each
// call.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/ops/backend.h"
#include "tests/common/test_util.h"

namespace mantissa::core {
namespace {

// Large enough for OpenMP to split the work and for several reduction blocks.
constexpr int64_t kLarge = 50021;

void fill_normal(Tensor& t, std::mt19937& rng, double sigma) {
  std::normal_distribution<double> dist(0.0, sigma);
  for (int64_t i = 0; i < t.numel(); ++i) set_value(t, i, static_cast<float>(dist(rng)));
}

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(c.data(), t.data(), static_cast<size_t>(t.nbytes()));
  return c;
}

// The whole of a flat buffer as one decayed range: adamw on a single tensor.
std::vector<ParamRange> whole(const Tensor& t) {
  return {ParamRange{0, t.numel(), true}};
}

class CpuOptim : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> backend = make_cpu_backend();
  std::mt19937 rng{20240326};
};

// ---------------------------------------------------------------------------------------
// AdamW

// AdamW in FP64, written from the algorithm's definition (Loshchilov & Hutter, with
// PyTorch's placement of the decoupled decay).
struct AdamWReference {
  std::vector<double> param, m, v;

  void step(const std::vector<double>& grad, const AdamWParams& p) {
    const double b1 = p.beta1, b2 = p.beta2;
    for (size_t i = 0; i < param.size(); ++i) {
      const double g = grad[i] * static_cast<double>(p.grad_scale);
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double m_hat = m[i] / (1 - std::pow(b1, static_cast<double>(p.step)));
      const double v_hat = v[i] / (1 - std::pow(b2, static_cast<double>(p.step)));
      param[i] -= static_cast<double>(p.lr) * (m_hat / (std::sqrt(v_hat) + p.eps) +
                                               static_cast<double>(p.weight_decay) * param[i]);
    }
  }
};

// got vs the FP64 reference, element by element: relative 1e-5, with a floor of 1e-6 of
// the largest reference magnitude for elements that happen to sit near zero (m is a
// difference of terms, so a small m carries the absolute error of the large ones). Equal
// non-finite values (NaN with NaN, inf with inf of the same sign) match.
void expect_close(const Tensor& got, const std::vector<double>& ref, const char* what) {
  double scale = 0.0;
  for (double r : ref) {
    if (std::isfinite(r)) scale = std::max(scale, std::fabs(r));
  }
  int failures = 0;
  for (int64_t i = 0; i < got.numel() && failures < 5; ++i) {
    const double g = value_at(got, i);
    const double r = ref[i];
    const bool ok = std::isnan(r)   ? std::isnan(g)
                    : std::isinf(r) ? g == r
                                    : std::fabs(g - r) <= 1e-5 * std::fabs(r) + 1e-6 * scale;
    if (!ok) {
      ++failures;
      ADD_FAILURE() << what << "[" << i << "]: expected " << r << ", got " << g;
    }
  }
}

// The compute copy must be the updated FP32 parameter rounded to nearest even: bit-equal to
// dtype.h's rounding of the FP32 value, and within half an ulp of it in FP64.
void expect_compute_copy(const Tensor& copy, const Tensor& params) {
  int failures = 0;
  for (int64_t i = 0; i < params.numel() && failures < 5; ++i) {
    const float p = params.data_as<float>()[i];
    const double c = value_at(copy, i);
    bool ok =
        std::isnan(p) ? std::isnan(c) : std::fabs(c - p) <= half_ulp(copy.dtype(), std::fabs(p));
    switch (copy.dtype()) {
      case DType::kF32: ok = ok && std::memcmp(&copy.data_as<float>()[i], &p, 4) == 0; break;
      case DType::kBF16: ok = ok && copy.data_as<bf16>()[i].bits == bf16_from_float(p).bits; break;
      case DType::kF16: ok = ok && copy.data_as<fp16>()[i].bits == fp16_from_float(p).bits; break;
      default: ok = false;
    }
    if (!ok) {
      ++failures;
      ADD_FAILURE() << dtype_name(copy.dtype()) << " compute copy [" << i << "] of " << p << " is "
                    << c;
    }
  }
}

struct AdamWCase {
  DType grad_type;
  DType copy_type;  // kI32 stands for "no compute copy"
  float grad_scale;
  float weight_decay;
};

// Five steps from zero moments on random parameters, each compared with the FP64
// reference. Gradients are stored multiplied by 1 / grad_scale, as a loss-scaled backward
// would leave them, and their stored (rounded) values feed the reference.
TEST_F(CpuOptim, AdamWMatchesFp64OverSeveralSteps) {
  const AdamWCase cases[] = {{DType::kF32, DType::kI32, 1.0f, 0.0f},
                             {DType::kF32, DType::kBF16, 1.0f / 1024, 0.1f},
                             {DType::kBF16, DType::kF16, 1.0f / 65536, 0.01f},
                             {DType::kBF16, DType::kF32, 0.5f, 0.1f}};
  for (const AdamWCase& c : cases) {
    SCOPED_TRACE(std::string("grads ") + dtype_name(c.grad_type) + ", copy " +
                 (c.copy_type == DType::kI32 ? "none" : dtype_name(c.copy_type)) + ", grad_scale " +
                 std::to_string(c.grad_scale));
    Tensor params = Tensor::empty(Shape{kLarge}, DType::kF32);
    Tensor m = Tensor::empty(Shape{kLarge}, DType::kF32);
    Tensor v = Tensor::empty(Shape{kLarge}, DType::kF32);
    Tensor grads = Tensor::empty(Shape{kLarge}, c.grad_type);
    fill_normal(params, rng, 1.0);
    for (int64_t i = 0; i < kLarge; ++i) set_value(m, i, 0.0f);
    for (int64_t i = 0; i < kLarge; ++i) set_value(v, i, 0.0f);
    AdamWReference ref{values_of(params), values_of(m), values_of(v)};
    Tensor copy;
    if (c.copy_type != DType::kI32) copy = Tensor::empty(Shape{kLarge}, c.copy_type);

    AdamWParams p;
    p.lr = 1e-2f;
    p.beta1 = 0.9f;
    p.beta2 = 0.95f;
    p.eps = 1e-8f;
    p.weight_decay = c.weight_decay;
    p.grad_scale = c.grad_scale;
    for (int64_t step = 1; step <= 5; ++step) {
      SCOPED_TRACE("step " + std::to_string(step));
      fill_normal(grads, rng, 0.1 / c.grad_scale);
      p.step = step;
      if (copy.defined()) poison(copy);
      backend->adamw(params, grads, m, v, copy.defined() ? &copy : nullptr, whole(params), p);
      ref.step(values_of(grads), p);
      expect_close(params, ref.param, "params");
      expect_close(m, ref.m, "m");
      expect_close(v, ref.v, "v");
      if (copy.defined()) expect_compute_copy(copy, params);
    }
  }
}

// At a large step the bias corrections are 1 (beta^step underflows); a first step from a
// nonzero state (a resumed run) and a step at 10000 both follow the reference.
TEST_F(CpuOptim, AdamWBiasCorrectionAtLateSteps) {
  Tensor params = Tensor::empty(Shape{1000}, DType::kF32);
  Tensor m = Tensor::empty(Shape{1000}, DType::kF32);
  Tensor v = Tensor::empty(Shape{1000}, DType::kF32);
  Tensor grads = Tensor::empty(Shape{1000}, DType::kF32);
  fill_normal(params, rng, 1.0);
  fill_normal(m, rng, 0.01);
  fill_normal(grads, rng, 0.1);
  for (int64_t i = 0; i < 1000; ++i) set_value(v, i, static_cast<float>(1e-4 * (1 + i % 7)));
  AdamWReference ref{values_of(params), values_of(m), values_of(v)};
  AdamWParams p;
  p.lr = 3e-4f;
  p.weight_decay = 0.1f;
  for (int64_t step : {int64_t{10}, int64_t{10000}}) {
    p.step = step;
    backend->adamw(params, grads, m, v, nullptr, whole(params), p);
    ref.step(values_of(grads), p);
    expect_close(params, ref.param, "params");
    expect_close(m, ref.m, "m");
    expect_close(v, ref.v, "v");
  }
}

// adamw does not check its inputs for inf/NaN (the trainer skips the step before calling it,
// see core/ops/math/adamw_update.h). What it does with one, as documented: the bad element's m, v
// and parameter (and compute copy) become non-finite, exactly as IEEE arithmetic on the update
// formula gives (the FP64 reference, run on the same gradients, says the same), and every
// other element is updated normally.
TEST_F(CpuOptim, AdamWWithNonFiniteGradientPoisonsOnlyThoseElements) {
  const int64_t n = kLarge;
  Tensor params = Tensor::empty(Shape{n}, DType::kF32);
  Tensor m = Tensor::empty(Shape{n}, DType::kF32);
  Tensor v = Tensor::empty(Shape{n}, DType::kF32);
  Tensor grads = Tensor::empty(Shape{n}, DType::kF32);
  Tensor copy = Tensor::empty(Shape{n}, DType::kBF16);
  fill_normal(params, rng, 1.0);
  fill_normal(m, rng, 0.01);
  fill_normal(grads, rng, 0.1);
  for (int64_t i = 0; i < n; ++i) set_value(v, i, 1e-3f);
  set_value(grads, 5, NAN);
  set_value(grads, n / 2, INFINITY);
  set_value(grads, n - 1, -INFINITY);
  AdamWReference ref{values_of(params), values_of(m), values_of(v)};
  AdamWParams p;
  p.lr = 1e-3f;
  p.step = 3;
  p.weight_decay = 0.1f;
  poison(copy);
  backend->adamw(params, grads, m, v, &copy, whole(params), p);
  ref.step(values_of(grads), p);
  expect_close(params, ref.param, "params");
  expect_close(m, ref.m, "m");
  expect_close(v, ref.v, "v");
  expect_compute_copy(copy, params);
  // Spelled out: which values the bad elements end with.
  for (int64_t i : {int64_t{5}, n / 2, n - 1}) {
    EXPECT_TRUE(std::isnan(value_at(params, i))) << i;
    EXPECT_TRUE(std::isnan(value_at(copy, i))) << i;
  }
  EXPECT_TRUE(std::isnan(value_at(m, 5)));
  EXPECT_TRUE(std::isnan(value_at(v, 5)));
  EXPECT_EQ(value_at(m, n / 2), INFINITY);
  EXPECT_EQ(value_at(v, n / 2), INFINITY);
  EXPECT_EQ(value_at(m, n - 1), -INFINITY);
  EXPECT_EQ(value_at(v, n - 1), INFINITY);
  int64_t non_finite = 0;
  for (int64_t i = 0; i < n; ++i) non_finite += !std::isfinite(value_at(params, i));
  EXPECT_EQ(non_finite, 3);
}

TEST_F(CpuOptim, AdamWRejectsBadOperands) {
  Tensor f32 = Tensor::empty(Shape{8}, DType::kF32);
  Tensor m = Tensor::empty(Shape{8}, DType::kF32);
  Tensor v = Tensor::empty(Shape{8}, DType::kF32);
  Tensor bf = Tensor::empty(Shape{8}, DType::kBF16);
  Tensor f16 = Tensor::empty(Shape{8}, DType::kF16);
  Tensor f32_9 = Tensor::empty(Shape{9}, DType::kF32);
  Tensor e4 = Tensor::empty(Shape{8}, DType::kE4M3);
  Tensor bf_9 = Tensor::empty(Shape{9}, DType::kBF16);
  AdamWParams p;
  expect_error([&] { backend->adamw(bf, f32, m, v, nullptr, whole(bf), p); }, {"adamw", "params"});
  expect_error([&] { backend->adamw(f32, f16, m, v, nullptr, whole(f32), p); }, {"adamw", "grads"});
  expect_error([&] { backend->adamw(f32, f32_9, m, v, nullptr, whole(f32), p); },
               {"adamw", "grads"});
  expect_error([&] { backend->adamw(f32, f32, bf, v, nullptr, whole(f32), p); }, {"adamw", "m"});
  expect_error([&] { backend->adamw(f32, f32, m, f32_9, nullptr, whole(f32), p); }, {"adamw", "v"});
  expect_error([&] { backend->adamw(f32, f32, m, v, &e4, whole(f32), p); },
               {"adamw", "compute_copy", "FP8"});
  expect_error([&] { backend->adamw(f32, f32, m, v, &bf_9, whole(f32), p); },
               {"adamw", "compute_copy"});
  AdamWParams step0;
  step0.step = 0;
  expect_error([&] { backend->adamw(f32, f32, m, v, nullptr, whole(f32), step0); },
               {"adamw", "step"});
  AdamWParams beta1;
  beta1.beta1 = 1.0f;
  expect_error([&] { backend->adamw(f32, f32, m, v, nullptr, whole(f32), beta1); },
               {"adamw", "beta1"});
  AdamWParams beta2;
  beta2.beta2 = -0.1f;
  expect_error([&] { backend->adamw(f32, f32, m, v, nullptr, whole(f32), beta2); },
               {"adamw", "beta2"});
}

// One call over several ranges of flat buffers (how the optimizer updates a whole model)
// updates each range exactly as a call on that range alone, with the weight decay where the
// range asks for it and none elsewhere, and leaves every element outside the ranges as it was:
// the gaps between ranges, an empty range, odd offsets and sizes, one range large enough to be
// split among threads.
TEST_F(CpuOptim, AdamWOverRangesUpdatesEachRangeAsAloneAndNothingElse) {
  const std::vector<ParamRange> ranges = {{3, 5, true},
                                          {8, 1000, false},
                                          {1010, 0, true},
                                          {1010, kLarge, true},
                                          {kLarge + 1017, 77, false}};
  const int64_t n = kLarge + 1017 + 77 + 9;
  Tensor params = Tensor::empty(Shape{n}, DType::kF32);
  Tensor m = Tensor::empty(Shape{n}, DType::kF32);
  Tensor v = Tensor::empty(Shape{n}, DType::kF32);
  Tensor grads = Tensor::empty(Shape{n}, DType::kBF16);
  Tensor copy = Tensor::empty(Shape{n}, DType::kBF16);
  fill_normal(params, rng, 1.0);
  fill_normal(m, rng, 0.01);
  fill_normal(grads, rng, 0.1);
  for (int64_t i = 0; i < n; ++i) set_value(v, i, static_cast<float>(1e-4 * (1 + i % 5)));
  poison(copy);
  Tensor params_alone = copy_of(params), m_alone = copy_of(m), v_alone = copy_of(v);
  Tensor copy_alone = copy_of(copy);
  AdamWParams p;
  p.lr = 1e-2f;
  p.step = 4;
  p.weight_decay = 0.5f;  // large enough that a range decayed by mistake differs in every bit

  backend->adamw(params, grads, m, v, &copy, ranges, p);
  for (const ParamRange& r : ranges) {
    const Shape shape{r.numel};
    Tensor pr = params_alone.view(r.offset, shape), mr = m_alone.view(r.offset, shape);
    Tensor vr = v_alone.view(r.offset, shape), cr = copy_alone.view(r.offset, shape);
    AdamWParams alone = p;
    alone.weight_decay = r.weight_decay ? p.weight_decay : 0.0f;
    backend->adamw(pr, grads.view(r.offset, shape), mr, vr, &cr, whole(pr), alone);
  }
  for (const auto& [got, want, what] :
       {std::tuple{&params, &params_alone, "params"}, std::tuple{&m, &m_alone, "m"},
        std::tuple{&v, &v_alone, "v"}, std::tuple{&copy, &copy_alone, "compute copy"}}) {
    EXPECT_EQ(std::memcmp(got->data(), want->data(), static_cast<size_t>(got->nbytes())), 0)
        << what << " differs from one call per range (the elements outside the ranges, or a "
        << "range's weight decay)";
  }
  // The per-range calls above leave the gaps alone too; say directly that they kept their values.
  EXPECT_TRUE(std::isnan(value_at(copy, 0)) && std::isnan(value_at(copy, 1009)) &&
              std::isnan(value_at(copy, n - 1)));
  EXPECT_FALSE(std::isnan(value_at(copy, 3)) || std::isnan(value_at(copy, 1010)));
}

TEST_F(CpuOptim, AdamWRejectsRangesOutsideOrOverlapping) {
  Tensor f32 = Tensor::empty(Shape{8}, DType::kF32);
  Tensor m = Tensor::empty(Shape{8}, DType::kF32);
  Tensor v = Tensor::empty(Shape{8}, DType::kF32);
  const AdamWParams p;
  const std::vector<std::vector<ParamRange>> bad = {{{0, 5, true}, {4, 2, true}},  // overlapping
                                                    {{5, 2, true}, {0, 2, true}},  // out of order
                                                    {{6, 3, false}},               // past the end
                                                    {{-1, 2, false}},   // before the start
                                                    {{0, -1, false}}};  // negative size
  for (const std::vector<ParamRange>& ranges : bad) {
    SCOPED_TRACE("first range [" + std::to_string(ranges[0].offset) + ", +" +
                 std::to_string(ranges[0].numel) + ")");
    expect_error([&] { backend->adamw(f32, f32, m, v, nullptr, ranges, p); }, {"adamw", "range"});
  }
}

// ---------------------------------------------------------------------------------------
// sum_squares

// out += sum x^2, accumulated in FP64 and rounded once: within one FP32 rounding of the
// FP64 sum (which is itself exact to ~1e-12 here). The bits must not depend on the thread
// count.
TEST_F(CpuOptim, SumSquaresMatchesFp64AndIsDeterministic) {
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t n : {kLarge, int64_t{1}, int64_t{4096}, int64_t{0}}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " n " + std::to_string(n));
      Tensor x = Tensor::empty(Shape{n}, type);
      fill_normal(x, rng, 3.0);
      double ref = 3.5;
      for (double xi : values_of(x)) ref += xi * xi;
      std::vector<float> results;
      for (int threads : {1, 2, 3}) {
        Tensor out = f32_scalar(3.5f);
        with_threads(threads, [&] { backend->sum_squares(x, out); });
        results.push_back(out.data_as<float>()[0]);
      }
      EXPECT_LE(std::fabs(results[0] - ref), 0x1p-23 * ref);
      for (float r : results) EXPECT_EQ(std::memcmp(&r, &results[0], 4), 0);
    }
  }
  // A global norm: several tensors into one accumulator.
  Tensor a = Tensor::empty(Shape{1000}, DType::kF32);
  Tensor b = Tensor::empty(Shape{3000}, DType::kBF16);
  fill_normal(a, rng, 1.0);
  fill_normal(b, rng, 2.0);
  double ref = 0.0;
  for (double xi : values_of(a)) ref += xi * xi;
  for (double xi : values_of(b)) ref += xi * xi;
  Tensor out = f32_scalar(0.0f);
  backend->sum_squares(a, out);
  backend->sum_squares(b, out);
  EXPECT_LE(std::fabs(out.data_as<float>()[0] - ref), 2 * 0x1p-23 * ref);
  // A NaN makes the sum NaN.
  set_value(a, 999, NAN);
  backend->sum_squares(a, out);
  EXPECT_TRUE(std::isnan(out.data_as<float>()[0]));

  Tensor ints = Tensor::empty(Shape{4}, DType::kI32);
  Tensor e5 = Tensor::empty(Shape{4}, DType::kE5M2);
  Tensor wide = Tensor::empty(Shape{2}, DType::kF32);
  Tensor i64 = i64_scalar(0);
  expect_error([&] { backend->sum_squares(ints, out); }, {"sum_squares", "x"});
  expect_error([&] { backend->sum_squares(e5, out); }, {"sum_squares", "x"});
  expect_error([&] { backend->sum_squares(a, wide); }, {"sum_squares", "out"});
  expect_error([&] { backend->sum_squares(a, i64); }, {"sum_squares", "out"});
}

// ---------------------------------------------------------------------------------------
// unscale_check_finite

// Every finite element must equal x * inv_scale rounded once to the dtype; every
// non-finite one must stay non-finite.
void expect_unscaled(const Tensor& x, const std::vector<double>& before, float inv_scale) {
  int failures = 0;
  for (int64_t i = 0; i < x.numel() && failures < 5; ++i) {
    const double got = value_at(x, i);
    bool ok;
    if (!std::isfinite(before[i])) {
      ok = !std::isfinite(got);
    } else {
      const double ref = before[i] * inv_scale;
      ok = std::fabs(got - ref) <=
           half_ulp(x.dtype(), std::fabs(ref) * (1 + 0x1p-23)) + std::fabs(ref) * 0x1p-24;
    }
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "element " << i << ": " << before[i] << " * " << inv_scale << " gave "
                    << got;
    }
  }
}

TEST_F(CpuOptim, UnscaleFindsTheFirstNonFiniteElement) {
  const int64_t n = kLarge;
  struct Case {
    std::vector<int64_t> bad;  // positions, given out of order on purpose
    int64_t first;
  };
  const Case cases[] = {{{0}, 0},
                        {{n / 2}, n / 2},
                        {{n - 1}, n - 1},
                        {{n - 1, 40000, 4096, 12345, 4097}, 4096},
                        {{30000, 4095}, 4095}};
  const float bad_values[] = {INFINITY, -INFINITY, NAN};
  for (DType type : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (float inv_scale : {1.0f / 65536, 0.3f}) {
      for (const Case& c : cases) {
        for (int threads : {1, 2, 3}) {
          SCOPED_TRACE(std::string(dtype_name(type)) + " inv_scale " + std::to_string(inv_scale) +
                       " first " + std::to_string(c.first) + " threads " + std::to_string(threads));
          Tensor x = Tensor::empty(Shape{n}, type);
          fill_normal(x, rng, 100.0);
          for (size_t k = 0; k < c.bad.size(); ++k) set_value(x, c.bad[k], bad_values[k % 3]);
          const std::vector<double> before = values_of(x);
          Tensor found = f32_scalar(0.0f);
          Tensor first = i64_scalar(-12345);
          with_threads(threads,
                       [&] { backend->unscale_check_finite(x, inv_scale, found, &first); });
          EXPECT_EQ(found.data_as<float>()[0], 1.0f);
          EXPECT_EQ(first.data_as<int64_t>()[0], c.first);
          expect_unscaled(x, before, inv_scale);
        }
      }
    }
  }
}

// found is only ever raised: a clean call leaves it as it was (0 stays 0, 1 stays 1), while
// first_index is rewritten each call (-1 when clean). first_index may be omitted.
TEST_F(CpuOptim, UnscaleFoundFlagIsSticky) {
  Tensor x = Tensor::empty(Shape{kLarge}, DType::kF32);
  fill_normal(x, rng, 1.0);
  Tensor found = f32_scalar(0.0f);
  Tensor first = i64_scalar(777);
  std::vector<double> before = values_of(x);
  backend->unscale_check_finite(x, 0.25f, found, &first);
  EXPECT_EQ(found.data_as<float>()[0], 0.0f);
  EXPECT_EQ(first.data_as<int64_t>()[0], -1);
  expect_unscaled(x, before, 0.25f);

  set_value(x, 123, NAN);
  backend->unscale_check_finite(x, 1.0f, found, nullptr);
  EXPECT_EQ(found.data_as<float>()[0], 1.0f);

  Tensor clean = Tensor::empty(Shape{kLarge}, DType::kBF16);
  fill_normal(clean, rng, 1.0);
  before = values_of(clean);
  backend->unscale_check_finite(clean, 0.5f, found, &first);
  EXPECT_EQ(found.data_as<float>()[0], 1.0f);
  EXPECT_EQ(first.data_as<int64_t>()[0], -1);
  expect_unscaled(clean, before, 0.5f);

  Tensor empty = Tensor::empty(Shape{0}, DType::kF32);
  Tensor found0 = f32_scalar(0.0f);
  backend->unscale_check_finite(empty, 0.5f, found0, &first);
  EXPECT_EQ(found0.data_as<float>()[0], 0.0f);
  EXPECT_EQ(first.data_as<int64_t>()[0], -1);
}

// Finiteness is judged before scaling (the contract): a finite value that only overflows
// because inv_scale > 1 is not reported, though it ends up inf.
TEST_F(CpuOptim, UnscaleChecksBeforeScaling) {
  Tensor x = Tensor::empty(Shape{3}, DType::kF32);
  set_value(x, 0, 1.0f);
  set_value(x, 1, 3.0e38f);
  set_value(x, 2, -2.0f);
  Tensor found = f32_scalar(0.0f);
  Tensor first = i64_scalar(777);
  backend->unscale_check_finite(x, 4.0f, found, &first);
  EXPECT_EQ(found.data_as<float>()[0], 0.0f);
  EXPECT_EQ(first.data_as<int64_t>()[0], -1);
  EXPECT_EQ(value_at(x, 0), 4.0);
  EXPECT_EQ(value_at(x, 1), INFINITY);
  EXPECT_EQ(value_at(x, 2), -8.0);
}

TEST_F(CpuOptim, UnscaleRejectsBadOperands) {
  Tensor x = Tensor::empty(Shape{4}, DType::kF32);
  Tensor ints = Tensor::empty(Shape{4}, DType::kI32);
  Tensor found = f32_scalar(0.0f);
  Tensor found_i64 = i64_scalar(0);
  Tensor first = i64_scalar(0);
  Tensor first_f32 = f32_scalar(0.0f);
  expect_error([&] { backend->unscale_check_finite(ints, 1.0f, found, &first); },
               {"unscale_check_finite", "x"});
  expect_error([&] { backend->unscale_check_finite(x, 1.0f, found_i64, &first); },
               {"unscale_check_finite", "found"});
  expect_error([&] { backend->unscale_check_finite(x, 1.0f, found, &first_f32); },
               {"unscale_check_finite", "first_index"});
  expect_error([&] { backend->unscale_check_finite(x, NAN, found, &first); },
               {"unscale_check_finite", "inv_scale"});
}

}  // namespace
}  // namespace mantissa::core
