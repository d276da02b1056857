// The CPU ops of Llama-style decoders (RMSNorm, RoPE, SwiGLU) against FP64 references written
// here independently of the backend: every forward directly, every backward by central finite
// differences of the FP64 forward and, at larger shapes, against FP64 analytic gradients
// (themselves checked by finite differences). Outputs are filled with NaN before each call, so
// an element an op forgets to write shows up as a mismatch; dgamma is pre-filled with random
// values to check that it accumulates.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/rope_table.h"
#include "tests/common/test_util.h"
#include "tests/core/fp64_reference.h"

namespace mantissa::core {
namespace {

// ---------------------------------------------------------------------------------------
// More host tensors and operands (tests/core/fp64_reference.h has the shared ones).

Tensor clone(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(c.data(), t.data(), t.nbytes());
  return c;
}

Vec uniform(std::mt19937_64& rng, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

Vec minus(const Vec& a, const Vec& b) {
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] - b[i];
  return out;
}

// ---------------------------------------------------------------------------------------
// FP64 references.

constexpr double kNormEps = 1e-5;

struct RmsNormRef {
  Vec out, rstd;
};

RmsNormRef rmsnorm_ref(const Vec& x, const Vec& gamma, int64_t C, double eps = kNormEps) {
  const int64_t N = static_cast<int64_t>(x.size()) / C;
  RmsNormRef r{Vec(x.size()), Vec(N)};
  for (int64_t n = 0; n < N; ++n) {
    double sq = 0.0;
    for (int64_t c = 0; c < C; ++c) sq += x[n * C + c] * x[n * C + c];
    const double s = 1.0 / std::sqrt(sq / static_cast<double>(C) + eps);
    for (int64_t c = 0; c < C; ++c) r.out[n * C + c] = x[n * C + c] * s * gamma[c];
    r.rstd[n] = s;
  }
  return r;
}

struct RmsNormGrads {
  Vec dx, dgamma;
};

// dx through the explicit Jacobian of xhat = x rstd: d xhat_j / d x_i = rstd (delta_ij -
// xhat_i xhat_j / C).
RmsNormGrads rmsnorm_backward_ref(const Vec& dout, const Vec& x, const Vec& gamma, int64_t C) {
  const int64_t N = static_cast<int64_t>(x.size()) / C;
  const RmsNormRef stats = rmsnorm_ref(x, gamma, C);
  RmsNormGrads g{Vec(x.size(), 0.0), Vec(C, 0.0)};
  for (int64_t n = 0; n < N; ++n) {
    const double s = stats.rstd[n];
    for (int64_t i = 0; i < C; ++i) {
      double dxi = 0.0;
      for (int64_t j = 0; j < C; ++j) {
        const double jac = s * ((i == j ? 1.0 : 0.0) - x[n * C + i] * s * x[n * C + j] * s / C);
        dxi += dout[n * C + j] * gamma[j] * jac;
      }
      g.dx[n * C + i] = dxi;
      g.dgamma[i] += dout[n * C + i] * x[n * C + i] * s;
    }
  }
  return g;
}

// RoPE on x[B, T, H, D] at positions start + t, angles in FP64 straight from the definition
// (a = p theta^(-2i/D)), rotated by sign * a.
Vec rope_ref(const Vec& x, const Shape& shape, int64_t start, double theta, double sign = 1.0) {
  const int64_t T = shape[1], H = shape[2], D = shape[3], half = D / 2;
  Vec out(x.size());
  for (int64_t row = 0; row < shape.numel() / D; ++row) {
    const int64_t p = start + row / H % T;
    for (int64_t i = 0; i < half; ++i) {
      const double a = sign * static_cast<double>(p) *
                       std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(D));
      const double lo = x[row * D + i], hi = x[row * D + half + i];
      out[row * D + i] = lo * std::cos(a) - hi * std::sin(a);
      out[row * D + half + i] = hi * std::cos(a) + lo * std::sin(a);
    }
  }
  return out;
}

double silu_ref(double g) {
  return g / (1.0 + std::exp(-g));
}

// out[N, I] from gate_up[N, 2I].
Vec swiglu_ref(const Vec& gate_up, int64_t I) {
  const int64_t N = static_cast<int64_t>(gate_up.size()) / (2 * I);
  Vec out(static_cast<size_t>(N * I));
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t j = 0; j < I; ++j) {
      out[n * I + j] = silu_ref(gate_up[n * 2 * I + j]) * gate_up[n * 2 * I + I + j];
    }
  }
  return out;
}

// dgate_up from dout, by the chain rule with silu'(g) = s (1 + g (1 - s)).
Vec swiglu_backward_ref(const Vec& dout, const Vec& gate_up, int64_t I) {
  Vec d(gate_up.size());
  for (size_t k = 0; k < dout.size(); ++k) {
    const int64_t n = static_cast<int64_t>(k) / I, j = static_cast<int64_t>(k) % I;
    const double g = gate_up[n * 2 * I + j], u = gate_up[n * 2 * I + I + j];
    const double s = 1.0 / (1.0 + std::exp(-g));
    d[n * 2 * I + j] = dout[k] * u * s * (1.0 + g * (1.0 - s));
    d[n * 2 * I + I + j] = dout[k] * silu_ref(g);
  }
  return d;
}

// ---------------------------------------------------------------------------------------
// RMSNorm

struct RmsNormCase {
  int64_t N, C;
  DType x_dtype, out_dtype, param_dtype;
  double rtol;
};

TEST(CpuRmsNorm, ForwardMatchesFp64) {
  const RmsNormCase cases[] = {
      {10, 8, DType::kF32, DType::kF32, DType::kF32, 1e-5},
      {70, 100, DType::kF32, DType::kF32, DType::kF32, 1e-5},
      {70, 100, DType::kBF16, DType::kBF16, DType::kBF16, 1e-2},
      {70, 100, DType::kBF16, DType::kF32, DType::kF32, 1e-5},
      {70, 100, DType::kF32, DType::kBF16, DType::kF32, 1e-2},
      {70, 100, DType::kF16, DType::kF16, DType::kF32, 2e-3},
      {33, 64, DType::kF16, DType::kF16, DType::kF16, 2e-3},
  };
  CpuBackend be;
  std::mt19937_64 rng(1);
  for (const RmsNormCase& k : cases) {
    const std::string what = std::string("x ") + dtype_name(k.x_dtype) + " out " +
                             dtype_name(k.out_dtype) + " gamma " + dtype_name(k.param_dtype) +
                             " C " + std::to_string(k.C);
    Tensor x = make({k.N, k.C}, k.x_dtype, uniform(rng, k.N * k.C, -3.0, 3.0));
    Tensor gamma = make({k.C}, k.param_dtype, uniform(rng, k.C, 0.5, 1.5));
    Tensor out = poisoned({k.N, k.C}, k.out_dtype);
    Tensor rstd = poisoned({k.N}, DType::kF32);
    be.rmsnorm_forward(x, gamma, static_cast<float>(kNormEps), out, rstd);
    const RmsNormRef ref = rmsnorm_ref(values_of(x), values_of(gamma), k.C);
    expect_close(values_of(out), ref.out, k.rtol, what + " out");
    // The statistic comes from the stored inputs and is kept in FP32 whatever the dtypes.
    expect_close(values_of(rstd), ref.rstd, 1e-5, what + " rstd");
  }
}

TEST(CpuRmsNorm, EpsIsTheCallersAndNarrowOutputsAreRoundedOnce) {
  CpuBackend be;
  std::mt19937_64 rng(2);
  const int64_t C = 40;
  // Small inputs, so that eps = 1e-2 moves the result far beyond rounding.
  Tensor x = make({3, 4, C}, DType::kBF16, uniform(rng, 12 * C, -0.1, 0.1));
  Tensor gamma = make({C}, DType::kF32, uniform(rng, C));
  Tensor wide = poisoned({3, 4, C}, DType::kF32);
  Tensor rstd = poisoned({3, 4}, DType::kF32);
  be.rmsnorm_forward(x, gamma, 1e-2f, wide, rstd);
  expect_close(values_of(wide), rmsnorm_ref(values_of(x), values_of(gamma), C, 1e-2).out, 1e-5,
               "eps 1e-2");
  for (DType narrow_dtype : {DType::kBF16, DType::kF16}) {
    Tensor narrow = poisoned({3, 4, C}, narrow_dtype);
    be.rmsnorm_forward(x, gamma, 1e-2f, narrow, rstd);
    expect_rounded_once(wide, narrow, std::string("rmsnorm out ") + dtype_name(narrow_dtype));
  }
}

// Runs rmsnorm_backward after a forward that produces rstd. dx is poisoned; dgamma starts from
// `prefill` to check that it accumulates (the returned dgamma is the increment).
RmsNormGrads run_rmsnorm_backward(CpuBackend& be, const Tensor& x, const Tensor& gamma,
                                  const Tensor& dout, DType dx_dtype, const Vec& prefill) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  Tensor out = poisoned(x.shape(), DType::kF32);
  Tensor rstd = poisoned({N}, DType::kF32);
  be.rmsnorm_forward(x, gamma, static_cast<float>(kNormEps), out, rstd);
  Tensor dx = poisoned(x.shape(), dx_dtype);
  Tensor dgamma = make({C}, DType::kF32, prefill);
  be.rmsnorm_backward(dout, x, gamma, rstd, dx, dgamma);
  return {values_of(dx), minus(values_of(dgamma), values_of(make({C}, DType::kF32, prefill)))};
}

TEST(CpuRmsNorm, BackwardMatchesFiniteDifferences) {
  CpuBackend be;
  std::mt19937_64 rng(3);
  const int64_t B = 2, T = 5, C = 8;
  const Shape shape{B, T, C};
  const Tensor x = make(shape, DType::kF32, uniform(rng, B * T * C, -2.0, 2.0));
  const Tensor gamma = make({C}, DType::kF32, uniform(rng, C, 0.5, 1.5));
  const Vec w = values_of(make(shape, DType::kF32, uniform(rng, B * T * C)));  // L = out . w
  const Vec xv = values_of(x), gv = values_of(gamma);

  const Vec fd_x =
      finite_difference([&](const Vec& v) { return dot(rmsnorm_ref(v, gv, C).out, w); }, xv);
  const Vec fd_gamma =
      finite_difference([&](const Vec& v) { return dot(rmsnorm_ref(xv, v, C).out, w); }, gv);

  const RmsNormGrads ref = rmsnorm_backward_ref(w, xv, gv, C);
  expect_close(ref.dx, fd_x, 1e-6, "reference dx vs finite differences");
  expect_close(ref.dgamma, fd_gamma, 1e-6, "reference dgamma vs finite differences");

  const RmsNormGrads got =
      run_rmsnorm_backward(be, x, gamma, make(shape, DType::kF32, w), DType::kF32, uniform(rng, C));
  expect_close(got.dx, fd_x, 1e-5, "dx");
  expect_close(got.dgamma, fd_gamma, 1e-5, "dgamma (accumulated)");
}

TEST(CpuRmsNorm, BackwardMatchesFp64AtLargerShapeAndInPlace) {
  CpuBackend be;
  std::mt19937_64 rng(4);
  // C = 100 is not a multiple of the channel blocks; 300 rows span several of them.
  const int64_t N = 300, C = 100;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const double rtol = dtype == DType::kF32 ? 1e-5 : (dtype == DType::kF16 ? 2e-3 : 1e-2);
    const std::string what = dtype_name(dtype);
    const Tensor x = make({N, C}, dtype, uniform(rng, N * C, -3.0, 3.0));
    const Tensor gamma = make({C}, dtype, uniform(rng, C, 0.5, 1.5));
    const Tensor dout = make({N, C}, dtype, uniform(rng, N * C));
    const Vec prefill = uniform(rng, C);
    const RmsNormGrads ref =
        rmsnorm_backward_ref(values_of(dout), values_of(x), values_of(gamma), C);
    const RmsNormGrads got = run_rmsnorm_backward(be, x, gamma, dout, dtype, prefill);
    expect_close(got.dx, ref.dx, rtol, what + " dx");
    // dgamma is F32 and summed in FP32 whatever the activation dtype.
    expect_close(got.dgamma, ref.dgamma, 1e-5, what + " dgamma");

    // dx written over dout: the same bits.
    Tensor rstd = poisoned({N}, DType::kF32);
    Tensor out = poisoned({N, C}, DType::kF32);
    be.rmsnorm_forward(x, gamma, static_cast<float>(kNormEps), out, rstd);
    Tensor in_place = clone(dout);
    Tensor dgamma = make({C}, DType::kF32, prefill);
    be.rmsnorm_backward(in_place, x, gamma, rstd, in_place, dgamma);
    EXPECT_TRUE(same_bytes(in_place, make({N, C}, dtype, got.dx))) << what << " in place";
  }
}

// ---------------------------------------------------------------------------------------
// RoPE

constexpr double kTheta = 10000.0;

// Hugging Face's Llama: inv_freq = 1.0 / (theta ** (torch.arange(0, D, 2).float() / D)), in FP32.
TEST(CpuRope, TableHoldsHuggingFacesFp32Angles) {
  CpuBackend be;
  const int64_t S = 300, D = 16;
  const Tensor table = make_rope_table(be, S, D, kTheta);
  ASSERT_EQ(table.shape(), (Shape{S, D}));
  for (int64_t p = 0; p < S; ++p) {
    for (int64_t i = 0; i < D / 2; ++i) {
      const float exponent = static_cast<float>(2 * i) / static_cast<float>(D);
      const float inv_freq = 1.0f / static_cast<float>(std::pow(kTheta, double{exponent}));
      const double a = static_cast<double>(static_cast<float>(p) * inv_freq);
      ASSERT_EQ(table.data_as<float>()[p * D + i], static_cast<float>(std::cos(a)))
          << "cos p " << p << " i " << i;
      ASSERT_EQ(table.data_as<float>()[p * D + D / 2 + i], static_cast<float>(std::sin(a)))
          << "sin p " << p << " i " << i;
    }
  }
}

// PyTorch's inv_freq (torch 1.13 on x86-64, by the formula above) for head_dim 128, at the
// frequencies where theta^(-2i / 128) rounded to FP32 once is one ulp off it, so that a table
// built that way fails here; position 8191 shows the angle a long context sees.
TEST(CpuRope, TableHoldsPyTorchsInverseFrequenciesAtLlamasThetas) {
  struct Frequency {
    double theta;
    int64_t i;
    float inv_freq;
  };
  const Frequency from_pytorch[] = {
      {1e4, 7, 0x1.75f036p-2f},  {1e4, 10, 0x1.e5a846p-3f}, {1e4, 15, 0x1.d8ffacp-4f},
      {1e4, 18, 0x1.33281ap-4f}, {1e4, 24, 0x1.030dc6p-5f}, {1e4, 30, 0x1.b4f7e4p-7f},
      {5e5, 2, 0x1.53c38cp-1f},  {5e5, 4, 0x1.c2ef78p-2f},  {5e5, 8, 0x1.8d276p-3f},
      {5e5, 14, 0x1.d03ccep-5f}, {5e5, 19, 0x1.4d1272p-6f}, {5e5, 24, 0x1.ddee9ep-8f}};
  CpuBackend be;
  const int64_t S = 8192, D = 128;
  for (const double theta : {1e4, 5e5}) {
    const Tensor table = make_rope_table(be, S, D, theta);
    for (const Frequency& f : from_pytorch) {
      if (f.theta != theta) continue;
      for (const int64_t p : {int64_t{1}, S - 1}) {
        const double a = static_cast<double>(static_cast<float>(p) * f.inv_freq);
        EXPECT_EQ(table.data_as<float>()[p * D + f.i], static_cast<float>(std::cos(a)))
            << "theta " << theta << " i " << f.i << " p " << p;
        EXPECT_EQ(table.data_as<float>()[p * D + D / 2 + f.i], static_cast<float>(std::sin(a)))
            << "theta " << theta << " i " << f.i << " p " << p;
      }
    }
  }
}

TEST(CpuRope, ForwardMatchesFp64InPlaceOrNot) {
  CpuBackend be;
  std::mt19937_64 rng(5);
  const Tensor table = make_rope_table(be, 64, 12, kTheta);
  struct Case {
    Shape shape;
    int64_t start;
    DType in, out;
    double rtol;
  };
  const Case cases[] = {
      {Shape{2, 7, 3, 12}, 0, DType::kF32, DType::kF32, 1e-5},
      {Shape{1, 9, 5, 12}, 40, DType::kF32, DType::kF32, 1e-5},
      {Shape{3, 4, 2, 12}, 11, DType::kBF16, DType::kBF16, 1e-2},
      {Shape{3, 4, 2, 12}, 3, DType::kF16, DType::kF16, 2e-3},
      {Shape{2, 5, 4, 12}, 1, DType::kBF16, DType::kF32, 1e-5},
  };
  for (const Case& k : cases) {
    const std::string what = k.shape.str() + " start " + std::to_string(k.start) + " " +
                             dtype_name(k.in) + " -> " + dtype_name(k.out);
    const Tensor x = make(k.shape, k.in, uniform(rng, k.shape.numel()));
    Tensor out = poisoned(k.shape, k.out);
    be.rope_forward(x, table, k.start, k.shape[2], out);
    const Vec ref = rope_ref(values_of(x), k.shape, k.start, kTheta);
    // The table's angles are rounded to FP32 as HF rounds them: about p * 2^-24 radians.
    expect_close(values_of(out), ref, std::max(k.rtol, 1e-5), what);
    if (k.in == k.out) {
      Tensor in_place = clone(x);
      be.rope_forward(in_place, table, k.start, k.shape[2], in_place);
      EXPECT_TRUE(same_bytes(in_place, out)) << what << " in place";
    }
  }
}

TEST(CpuRope, NarrowOutputsAreRoundedOnceAndStartSelectsPositions) {
  CpuBackend be;
  std::mt19937_64 rng(6);
  const Shape shape{2, 6, 3, 8};
  const Tensor table = make_rope_table(be, 32, 8, 500000.0);
  const Tensor x = make(shape, DType::kF32, uniform(rng, shape.numel()));
  Tensor wide = poisoned(shape, DType::kF32);
  be.rope_forward(x, table, 5, 3, wide);
  for (DType narrow_dtype : {DType::kBF16, DType::kF16}) {
    Tensor narrow = poisoned(shape, narrow_dtype);
    be.rope_forward(x, table, 5, 3, narrow);
    expect_rounded_once(wide, narrow, std::string("rope out ") + dtype_name(narrow_dtype));
  }
  // Positions [5, 11) of a sequence of 11: the last six rows of the full forward (decoding
  // after a prompt rotates its new rows this way).
  const Shape full_shape{1, 11, 3, 8};
  const Tensor full_x = make(full_shape, DType::kF32, uniform(rng, full_shape.numel()));
  Tensor full = poisoned(full_shape, DType::kF32);
  be.rope_forward(full_x, table, 0, 3, full);
  const int64_t row = 3 * 8;
  Tensor tail_x = full_x.view(5 * row, Shape{1, 6, 3, 8});
  Tensor tail = poisoned({1, 6, 3, 8}, DType::kF32);
  be.rope_forward(tail_x, table, 5, 3, tail);
  EXPECT_EQ(std::memcmp(tail.data(), full.data_as<float>() + 5 * row, tail.nbytes()), 0);
}

TEST(CpuRope, BackwardMatchesFiniteDifferencesAndInvertsTheForward) {
  CpuBackend be;
  std::mt19937_64 rng(7);
  const Shape shape{2, 4, 3, 6};
  const int64_t start = 2;
  const Tensor table = make_rope_table(be, 8, 6, kTheta);
  const Vec xv = uniform(rng, shape.numel());
  const Vec w = values_of(make(shape, DType::kF32, uniform(rng, shape.numel())));  // L = out . w
  const Vec fd = finite_difference(
      [&](const Vec& v) { return dot(rope_ref(v, shape, start, kTheta), w); }, xv);
  expect_close(rope_ref(w, shape, start, kTheta, -1.0), fd, 1e-6,
               "reference (rotation by -angle) vs finite differences");

  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string what = dtype_name(dtype);
    const double rtol = dtype == DType::kF32 ? 1e-5 : 1e-2;
    const Tensor dout = make(shape, dtype, w);
    Tensor dx = poisoned(shape, dtype);
    be.rope_backward(dout, table, start, 3, dx);
    expect_close(values_of(dx), rope_ref(values_of(dout), shape, start, kTheta, -1.0), rtol,
                 what + " dx");
    Tensor in_place = clone(dout);
    be.rope_backward(in_place, table, start, 3, in_place);
    EXPECT_TRUE(same_bytes(in_place, dx)) << what << " in place";
  }
  expect_close(values_of([&] {
                 Tensor dx = poisoned(shape, DType::kF32);
                 be.rope_backward(make(shape, DType::kF32, w), table, start, 3, dx);
                 return dx;
               }()),
               fd, 1e-5, "dx vs finite differences");

  // The backward undoes the forward (rotations by a and -a), up to FP32 rounding.
  const Tensor x = make(shape, DType::kF32, xv);
  Tensor y = poisoned(shape, DType::kF32);
  be.rope_forward(x, table, start, 3, y);
  be.rope_backward(y, table, start, 3, y);
  expect_close(values_of(y), values_of(x), 2e-6, "backward of forward");
}

// The output of a fused q|k|v projection viewed as [B, T, n_head + 2 n_kv_head, D]: its q and
// k heads rotate in one call, its v heads are copied (or, in place, left alone).
TEST(CpuRope, RotatesTheLeadingHeadsOfAFusedQkv) {
  CpuBackend be;
  std::mt19937_64 rng(12);
  const int64_t B = 2, T = 5, n_head = 4, n_kv_head = 2, D = 8;
  const Shape qkv_shape{B, T, n_head + 2 * n_kv_head, D};
  const int64_t rotated = n_head + n_kv_head;
  const Tensor table = make_rope_table(be, T, D, kTheta);
  const Tensor qkv = make(qkv_shape, DType::kBF16, uniform(rng, qkv_shape.numel()));
  const Vec qkv_v = values_of(qkv);
  const Vec all_rotated = rope_ref(qkv_v, qkv_shape, 0, kTheta);
  for (int backward = 0; backward < 2; ++backward) {
    Tensor out = poisoned(qkv_shape, DType::kBF16);
    Tensor in_place = clone(qkv);
    if (backward) {
      be.rope_backward(qkv, table, 0, rotated, out);
      be.rope_backward(in_place, table, 0, rotated, in_place);
    } else {
      be.rope_forward(qkv, table, 0, rotated, out);
      be.rope_forward(in_place, table, 0, rotated, in_place);
    }
    const Vec expected_rotated =
        backward ? rope_ref(qkv_v, qkv_shape, 0, kTheta, -1.0) : all_rotated;
    const Vec got = values_of(out);
    Vec got_qk, want_qk;
    for (int64_t row = 0; row < B * T; ++row) {
      for (int64_t c = 0; c < qkv_shape[2] * D; ++c) {
        const int64_t k = row * qkv_shape[2] * D + c;
        if (c < rotated * D) {
          got_qk.push_back(got[k]);
          want_qk.push_back(expected_rotated[k]);
        } else {
          ASSERT_EQ(got[k], qkv_v[k]) << "v element " << k << " is not a copy";
        }
      }
    }
    expect_close(got_qk, want_qk, 1e-2, backward ? "q and k, backward" : "q and k, forward");
    EXPECT_TRUE(same_bytes(in_place, out)) << "in place, backward " << backward;
  }
}

// ---------------------------------------------------------------------------------------
// SwiGLU

TEST(CpuSwiglu, ForwardMatchesFp64) {
  CpuBackend be;
  std::mt19937_64 rng(8);
  struct Case {
    Shape gate_up;
    DType in, out;
    double rtol;
  };
  const Case cases[] = {
      {Shape{7, 2 * 5}, DType::kF32, DType::kF32, 1e-6},
      {Shape{2, 9, 2 * 48}, DType::kF32, DType::kF32, 1e-6},
      {Shape{30, 2 * 48}, DType::kBF16, DType::kBF16, 1e-2},
      {Shape{30, 2 * 48}, DType::kF16, DType::kF16, 2e-3},
      {Shape{30, 2 * 48}, DType::kBF16, DType::kF32, 1e-6},
  };
  for (const Case& k : cases) {
    const std::string what = k.gate_up.str() + " " + dtype_name(k.in) + " -> " + dtype_name(k.out);
    const int64_t I = k.gate_up[-1] / 2;
    std::vector<int64_t> out_dims = k.gate_up.dims();
    out_dims.back() = I;
    // Gates far into both tails of the sigmoid.
    const Tensor gate_up = make(k.gate_up, k.in, uniform(rng, k.gate_up.numel(), -12.0, 12.0));
    Tensor out = poisoned(Shape(out_dims), k.out);
    be.swiglu_forward(gate_up, out);
    expect_close(values_of(out), swiglu_ref(values_of(gate_up), I), k.rtol, what);
  }
}

TEST(CpuSwiglu, NarrowOutputsAreRoundedOnceAndTailsStayFinite) {
  CpuBackend be;
  std::mt19937_64 rng(9);
  const int64_t N = 6, I = 20;
  Vec v = uniform(rng, N * 2 * I, -4.0, 4.0);
  // Extreme gates: silu(g) -> 0 for g -> -inf (no 0 * inf), -> g for g -> +inf.
  v[0] = -1000.0;
  v[1] = 1000.0;
  v[2] = -90.0;
  v[3] = 3e38;
  const Tensor gate_up = make({N, 2 * I}, DType::kF32, v);
  Tensor wide = poisoned({N, I}, DType::kF32);
  be.swiglu_forward(gate_up, wide);
  for (DType narrow_dtype : {DType::kBF16, DType::kF16}) {
    Tensor narrow = poisoned({N, I}, narrow_dtype);
    be.swiglu_forward(gate_up, narrow);
    expect_rounded_once(wide, narrow, std::string("swiglu out ") + dtype_name(narrow_dtype));
  }
  const double u1 = values_of(gate_up)[I + 1];
  EXPECT_LT(std::fabs(wide.data_as<float>()[0]), 1e-30f) << "silu(-1000) * up";
  EXPECT_FLOAT_EQ(wide.data_as<float>()[1], static_cast<float>(1000.0 * u1));
  Tensor dgate_up = poisoned({N, 2 * I}, DType::kF32);
  be.swiglu_backward(make({N, I}, DType::kF32, Vec(N * I, 1.0)), gate_up, dgate_up);
  const Vec d = values_of(dgate_up);
  for (size_t i = 0; i < d.size(); ++i) EXPECT_TRUE(std::isfinite(d[i])) << "element " << i;
  EXPECT_LT(std::fabs(d[0]), 1e-30) << "silu'(-1000) * up";
  EXPECT_EQ(d[1], u1) << "silu'(1000) = 1";
}

TEST(CpuSwiglu, BackwardMatchesFiniteDifferencesAndInPlace) {
  CpuBackend be;
  std::mt19937_64 rng(10);
  const int64_t N = 4, I = 6;
  const Vec gu = uniform(rng, N * 2 * I, -5.0, 5.0);
  const Vec w = values_of(make({N, I}, DType::kF32, uniform(rng, N * I)));  // L = out . w
  const Vec fd = finite_difference([&](const Vec& v) { return dot(swiglu_ref(v, I), w); }, gu);
  expect_close(swiglu_backward_ref(w, gu, I), fd, 1e-6, "reference vs finite differences");

  const Tensor gate_up = make({N, 2 * I}, DType::kF32, gu);
  Tensor dgate_up = poisoned({N, 2 * I}, DType::kF32);
  be.swiglu_backward(make({N, I}, DType::kF32, w), gate_up, dgate_up);
  expect_close(values_of(dgate_up), fd, 1e-5, "dgate_up vs finite differences");

  // Larger, in every activation dtype, and written over gate_up.
  const int64_t N2 = 50, I2 = 72;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
    const std::string what = dtype_name(dtype);
    const double rtol = dtype == DType::kF32 ? 1e-5 : (dtype == DType::kF16 ? 2e-3 : 1e-2);
    const Tensor g2 = make({N2, 2 * I2}, dtype, uniform(rng, N2 * 2 * I2, -8.0, 8.0));
    const Tensor dout = make({N2, I2}, dtype, uniform(rng, N2 * I2));
    Tensor d2 = poisoned({N2, 2 * I2}, dtype);
    be.swiglu_backward(dout, g2, d2);
    expect_close(values_of(d2), swiglu_backward_ref(values_of(dout), values_of(g2), I2), rtol,
                 what + " dgate_up");
    Tensor in_place = clone(g2);
    be.swiglu_backward(dout, in_place, in_place);
    EXPECT_TRUE(same_bytes(in_place, d2)) << what << " in place";
  }
}

// ---------------------------------------------------------------------------------------
// Properties shared by the three ops

// Every reduction runs in an order fixed by the data (dgamma by blocks of channels), so the
// thread count cannot change a single bit.
// ---------------------------------------------------------------------------------------
// Key/value heads of grouped-query attention: rows of H query, KV key and KV value heads.

// The multi-head row layout [q heads | k heads | v heads] (H each) from grouped rows.
Vec repeat_kv_ref(const Vec& qkv, int64_t rows, int64_t H, int64_t KV, int64_t D) {
  const int64_t in_row = (H + 2 * KV) * D, out_row = 3 * H * D, group = H / KV;
  Vec out(static_cast<size_t>(rows * out_row));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t part = 0; part < 3; ++part) {
      for (int64_t h = 0; h < H; ++h) {
        const int64_t src_head = part == 0 ? h : H + (part - 1) * KV + h / group;
        for (int64_t d = 0; d < D; ++d) {
          out[r * out_row + (part * H + h) * D + d] = qkv[r * in_row + src_head * D + d];
        }
      }
    }
  }
  return out;
}

TEST(CpuKvHeads, RepeatCopiesEachKeyValueHeadToItsGroup) {
  CpuBackend be;
  std::mt19937_64 rng(21);
  struct Case {
    int64_t B, T, H, KV, D;
    DType in, out;
  };
  const Case cases[] = {
      {2, 3, 4, 2, 6, DType::kF32, DType::kF32},   {1, 5, 6, 1, 4, DType::kBF16, DType::kBF16},
      {2, 2, 8, 4, 2, DType::kF16, DType::kF16},   {1, 4, 3, 3, 8, DType::kF32, DType::kF32},
      {3, 1, 4, 1, 16, DType::kBF16, DType::kF32},
  };
  for (const Case& k : cases) {
    const std::string what = "H " + std::to_string(k.H) + " KV " + std::to_string(k.KV) + " " +
                             dtype_name(k.in) + " -> " + dtype_name(k.out);
    const int64_t rows = k.B * k.T, width = (k.H + 2 * k.KV) * k.D;
    const Tensor qkv = make({k.B, k.T, width}, k.in, uniform(rng, rows * width));
    Tensor out = poisoned({k.B, k.T, 3 * k.H * k.D}, k.out);
    be.repeat_kv_heads(qkv, k.H, k.KV, out);
    // A copy: exact (values_of the narrow input are representable in every output here).
    const Vec expected = repeat_kv_ref(values_of(qkv), rows, k.H, k.KV, k.D);
    const Vec actual = values_of(out);
    ASSERT_EQ(actual.size(), expected.size()) << what;
    for (size_t i = 0; i < actual.size(); ++i)
      ASSERT_EQ(actual[i], expected[i]) << what << " " << i;
  }
}

// The backward is the adjoint of the forward: <repeat(x), w> = <x, repeat_backward(w)> for
// every x, which the finite differences of the FP64 forward give element by element; and the
// group's gradients are summed in FP32, rounded once.
TEST(CpuKvHeads, BackwardSumsEachGroupAndIsTheAdjoint) {
  CpuBackend be;
  std::mt19937_64 rng(22);
  const int64_t B = 2, T = 3, H = 6, KV = 2, D = 4, rows = B * T;
  const int64_t width = (H + 2 * KV) * D;
  const Vec x = uniform(rng, rows * width);
  const Vec w = values_of(make({B, T, 3 * H * D}, DType::kF32, uniform(rng, rows * 3 * H * D)));
  const Vec fd =
      finite_difference([&](const Vec& v) { return dot(repeat_kv_ref(v, rows, H, KV, D), w); }, x);
  Tensor dqkv = poisoned({B, T, width}, DType::kF32);
  be.repeat_kv_heads_backward(make({B, T, 3 * H * D}, DType::kF32, w), H, KV, dqkv);
  expect_close(values_of(dqkv), fd, 1e-6, "dqkv against finite differences");

  const Tensor w_bf16 = make({B, T, 3 * H * D}, DType::kBF16, w);
  Tensor wide = poisoned({B, T, width}, DType::kF32);
  Tensor narrow = poisoned({B, T, width}, DType::kBF16);
  be.repeat_kv_heads_backward(w_bf16, H, KV, wide);
  be.repeat_kv_heads_backward(w_bf16, H, KV, narrow);
  expect_rounded_once(wide, narrow, "BF16 dqkv");
}

TEST(CpuKvHeads, BadArgumentsThrowNamingTheOpAndOperand) {
  CpuBackend be;
  Tensor qkv = make({1, 2, 8 * 4}, DType::kF32, Vec(64, 1.0));  // H 4 + 2 KV 2, D 4
  Tensor out = poisoned({1, 2, 3 * 4 * 4}, DType::kF32);
  be.repeat_kv_heads(qkv, 4, 2, out);
  expect_error([&] { be.repeat_kv_heads(qkv, 4, 3, out); },
               {"repeat_kv_heads", "n_kv_head = 3", "divide n_head = 4"});
  expect_error([&] { be.repeat_kv_heads(qkv, 5, 1, out); }, {"repeat_kv_heads", "qkv", "7 heads"});
  Tensor small = poisoned({1, 2, 40}, DType::kF32);
  expect_error([&] { be.repeat_kv_heads(qkv, 4, 2, small); }, {"repeat_kv_heads", "out"});
  Tensor flat = make({2, 32}, DType::kF32, Vec(64, 1.0));
  expect_error([&] { be.repeat_kv_heads(flat, 4, 2, out); }, {"repeat_kv_heads", "qkv"});
  expect_error([&] { be.repeat_kv_heads_backward(qkv, 4, 2, out); },
               {"repeat_kv_heads_backward", "dout", "[1, 2, 32]", "[1, 2, 72]"});
}

TEST(CpuLlamaOps, ResultsDoNotDependOnTheThreadCount) {
  CpuBackend be;
  std::mt19937_64 rng(11);
  const int64_t N = 301, C = 96, I = 40;
  const Shape rope_shape{3, 17, 4, 16};
  const Tensor x = make({N, C}, DType::kBF16, uniform(rng, N * C));
  const Tensor gamma = make({C}, DType::kF32, uniform(rng, C));
  const Tensor dy = make({N, C}, DType::kBF16, uniform(rng, N * C));
  const Tensor table = make_rope_table(be, 17, 16, kTheta);
  const Tensor q = make(rope_shape, DType::kBF16, uniform(rng, rope_shape.numel()));
  const Tensor gate_up = make({N, 2 * I}, DType::kBF16, uniform(rng, N * 2 * I, -6.0, 6.0));
  const Tensor dh = make({N, I}, DType::kBF16, uniform(rng, N * I));

  auto run_all = [&] {
    Tensor out = poisoned({N, C}, DType::kBF16), rstd = poisoned({N}, DType::kF32);
    be.rmsnorm_forward(x, gamma, 1e-6f, out, rstd);
    Tensor dx = poisoned({N, C}, DType::kBF16);
    Tensor dgamma = make({C}, DType::kF32, Vec(C, 0.0));
    be.rmsnorm_backward(dy, x, gamma, rstd, dx, dgamma);
    Tensor rq = poisoned(rope_shape, DType::kBF16), dq = poisoned(rope_shape, DType::kBF16);
    be.rope_forward(q, table, 0, 3, rq);
    be.rope_backward(q, table, 0, 4, dq);
    Tensor h = poisoned({N, I}, DType::kBF16), dgu = poisoned({N, 2 * I}, DType::kBF16);
    be.swiglu_forward(gate_up, h);
    be.swiglu_backward(dh, gate_up, dgu);
    return std::vector<Tensor>{out, rstd, dx, dgamma, rq, dq, h, dgu};
  };
  std::vector<Tensor> one, three;
  with_threads(1, [&] { one = run_all(); });
  with_threads(3, [&] { three = run_all(); });
  ASSERT_EQ(one.size(), three.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(same_bytes(one[i], three[i])) << "result " << i;
  }
}

TEST(CpuLlamaOps, BadArgumentsThrowNamingTheOpAndOperand) {
  CpuBackend be;
  const int64_t C = 8;
  Tensor x = make({4, C}, DType::kF32, Vec(4 * C, 1.0));
  Tensor gamma = make({C}, DType::kF32, Vec(C, 1.0));
  Tensor rstd = poisoned({4}, DType::kF32);
  Tensor out = poisoned({4, C}, DType::kF32);
  Tensor short_gamma = make({C - 1}, DType::kF32, Vec(C - 1, 1.0));
  expect_error([&] { be.rmsnorm_forward(x, short_gamma, 1e-5f, out, rstd); },
               {"rmsnorm_forward", "gamma", "[7]"});
  expect_error([&] { be.rmsnorm_forward(x, gamma, 0.0f, out, rstd); }, {"rmsnorm_forward", "eps"});
  expect_error([&] { be.rmsnorm_forward(x, gamma, NAN, out, rstd); }, {"rmsnorm_forward", "eps"});
  Tensor short_rstd = poisoned({3}, DType::kF32);
  expect_error([&] { be.rmsnorm_forward(x, gamma, 1e-5f, out, short_rstd); },
               {"rmsnorm_forward", "rstd"});
  Tensor ints = Tensor::empty({4, C}, DType::kI32);
  expect_error([&] { be.rmsnorm_forward(ints, gamma, 1e-5f, out, rstd); },
               {"rmsnorm_forward", "x", "dtype"});
  expect_error([&] { be.rmsnorm_forward(x, gamma, 1e-5f, x, rstd); },
               {"rmsnorm_forward", "out", "overlaps x"});
  Tensor bf16_grad = poisoned({C}, DType::kBF16);
  Tensor dx = poisoned({4, C}, DType::kF32);
  be.rmsnorm_forward(x, gamma, 1e-5f, out, rstd);
  expect_error([&] { be.rmsnorm_backward(out, x, gamma, rstd, dx, bf16_grad); },
               {"rmsnorm_backward", "dgamma", "dtype"});
  Tensor dgamma = make({C}, DType::kF32, Vec(C, 0.0));
  expect_error([&] { be.rmsnorm_backward(out, x, gamma, rstd, x, dgamma); },
               {"rmsnorm_backward", "dx", "overlaps x"});
  Tensor half_dout = out.view(0, Shape{2, C});
  Tensor shifted = out.view(C, Shape{2, C});
  expect_error(
      [&] {
        Tensor r2 = poisoned({2}, DType::kF32);
        be.rmsnorm_backward(half_dout, x.view(0, Shape{2, C}), gamma, r2, shifted, dgamma);
      },
      {"rmsnorm_backward", "dx", "partly"});

  const Tensor table = make_rope_table(be, 8, 4, kTheta);
  Tensor q = make({1, 8, 2, 4}, DType::kF32, Vec(64, 1.0));
  Tensor q_out = poisoned({1, 8, 2, 4}, DType::kF32);
  expect_error([&] { be.rope_forward(q, table, 1, 2, q_out); },
               {"rope_forward", "positions [1, 9)", "table"});
  expect_error([&] { be.rope_forward(q, table, -1, 2, q_out); }, {"rope_forward", "positions"});
  Tensor odd = make({1, 2, 1, 3}, DType::kF32, Vec(6, 1.0));
  Tensor odd_out = poisoned({1, 2, 1, 3}, DType::kF32);
  expect_error([&] { be.rope_forward(odd, table, 0, 1, odd_out); }, {"rope_forward", "x", "even"});
  Tensor wide = make({1, 2, 1, 6}, DType::kF32, Vec(12, 1.0));
  Tensor wide_out = poisoned({1, 2, 1, 6}, DType::kF32);
  expect_error([&] { be.rope_forward(wide, table, 0, 1, wide_out); },
               {"rope_forward", "table", "head_dim = 6"});
  Tensor flat = make({8, 8}, DType::kF32, Vec(64, 1.0));
  expect_error([&] { be.rope_forward(flat, table, 0, 1, q_out); },
               {"rope_forward", "x", "4 dimensions"});
  Tensor bf16_table = Tensor::empty({8, 4}, DType::kBF16);
  expect_error([&] { be.rope_backward(q, bf16_table, 0, 2, q_out); },
               {"rope_backward", "table", "dtype"});
  Tensor q_shifted = q.view(8, Shape{1, 6, 2, 4});
  expect_error(
      [&] {
        be.rope_backward(q.view(0, Shape{1, 6, 2, 4}), table, 0, 2, q_shifted);
      },
      {"rope_backward", "dx", "partly"});
  expect_error([&] { be.rope_forward(q, table, 0, 3, q_out); },
               {"rope_forward", "rotated = 3", "[1, 2]"});
  expect_error([&] { be.rope_backward(q, table, 0, 0, q_out); }, {"rope_backward", "rotated = 0"});
  expect_error([&] { make_rope_table(be, 8, 5, kTheta); }, {"make_rope_table", "head_dim = 5"});
  expect_error([&] { make_rope_table(be, 0, 4, kTheta); }, {"make_rope_table", "positions = 0"});
  expect_error([&] { make_rope_table(be, 8, 4, 0.5); }, {"make_rope_table", "theta"});

  Tensor gate_up = make({3, 10}, DType::kF32, Vec(30, 1.0));
  Tensor h = poisoned({3, 5}, DType::kF32);
  Tensor odd_gu = make({3, 9}, DType::kF32, Vec(27, 1.0));
  expect_error([&] { be.swiglu_forward(odd_gu, h); }, {"swiglu_forward", "gate_up", "even"});
  Tensor wrong_h = poisoned({3, 10}, DType::kF32);
  expect_error([&] { be.swiglu_forward(gate_up, wrong_h); }, {"swiglu_forward", "out", "[3, 5]"});
  Tensor h_in_gu = gate_up.view(0, Shape{3, 5});
  expect_error([&] { be.swiglu_forward(gate_up, h_in_gu); },
               {"swiglu_forward", "out", "overlaps gate_up"});
  Tensor dgu = poisoned({3, 10}, DType::kF32);
  Tensor e4m3 = Tensor::empty({3, 5}, DType::kE4M3);
  expect_error([&] { be.swiglu_backward(e4m3, gate_up, dgu); },
               {"swiglu_backward", "dout", "dtype"});
  expect_error([&] { be.swiglu_backward(h, gate_up, h_in_gu); }, {"swiglu_backward", "dgate_up"});
  Tensor dout_in_dgu = dgu.view(0, Shape{3, 5});
  expect_error([&] { be.swiglu_backward(dout_in_dgu, gate_up, dgu); },
               {"swiglu_backward", "dgate_up", "overlaps dout"});
}

}  // namespace
}  // namespace mantissa::core
