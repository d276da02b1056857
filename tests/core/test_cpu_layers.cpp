// The CPU layer ops (LayerNorm, causal attention, embeddings, softmax cross-entropy) against
// FP64 references written here independently of the backend: every forward directly, every
// backward both by central finite differences of the FP64 forward and, at larger shapes,
// against FP64 analytic gradients (which are themselves checked by finite differences).
// Outputs are filled with NaN before each call, so an element an op forgets to write shows
// up as a mismatch; parameter gradients are pre-filled with random values to check that they
// accumulate.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/ops/cpu/cpu_backend.h"
#include "tests/common/test_util.h"
#include "tests/core/attention_reference.h"
#include "tests/core/fp64_reference.h"

namespace mantissa::core {
namespace {

// ---------------------------------------------------------------------------------------
// More host tensors and operands (tests/core/fp64_reference.h has the shared ones).

Tensor make_indices(const Shape& shape, const std::vector<int32_t>& values) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  std::memcpy(t.data(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  Vec uniform(int64_t n, double lo = -1.0, double hi = 1.0) {
    std::uniform_real_distribution<double> dist(lo, hi);
    Vec v(static_cast<size_t>(n));
    for (double& x : v) x = dist(gen_);
    return v;
  }
  std::vector<int32_t> indices(int64_t n, int32_t limit) {
    std::uniform_int_distribution<int32_t> dist(0, limit - 1);
    std::vector<int32_t> v(static_cast<size_t>(n));
    for (int32_t& x : v) x = dist(gen_);
    return v;
  }

 private:
  std::mt19937_64 gen_;
};

Vec add(const Vec& a, const Vec& b) {
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] + b[i];
  return out;
}

Vec scaled(const Vec& a, double s) {
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = a[i] * s;
  return out;
}

// ---------------------------------------------------------------------------------------
// FP64 references.

constexpr double kEps = 1e-5;

struct LayerNormRef {
  Vec out, mean, rstd;
};

LayerNormRef layernorm_ref(const Vec& x, const Vec& gamma, const Vec& beta, int64_t C) {
  const int64_t N = static_cast<int64_t>(x.size()) / C;
  LayerNormRef r{Vec(x.size()), Vec(N), Vec(N)};
  for (int64_t n = 0; n < N; ++n) {
    const double* row = x.data() + n * C;
    double m = 0.0;
    for (int64_t c = 0; c < C; ++c) m += row[c];
    m /= static_cast<double>(C);
    double var = 0.0;
    for (int64_t c = 0; c < C; ++c) var += (row[c] - m) * (row[c] - m);
    var /= static_cast<double>(C);
    const double s = 1.0 / std::sqrt(var + kEps);
    for (int64_t c = 0; c < C; ++c) r.out[n * C + c] = (row[c] - m) * s * gamma[c] + beta[c];
    r.mean[n] = m;
    r.rstd[n] = s;
  }
  return r;
}

struct LayerNormGrads {
  Vec dx, dgamma, dbeta;
};

// dx through the explicit Jacobian of xhat = (x - mean) * rstd:
//   d xhat_j / d x_i = rstd (delta_ij - 1/C) - xhat_i xhat_j rstd / C.
LayerNormGrads layernorm_backward_ref(const Vec& dout, const Vec& x, const Vec& gamma, int64_t C) {
  const int64_t N = static_cast<int64_t>(x.size()) / C;
  const LayerNormRef stats = layernorm_ref(x, gamma, Vec(C, 0.0), C);
  LayerNormGrads g{Vec(x.size(), 0.0), Vec(C, 0.0), Vec(C, 0.0)};
  for (int64_t n = 0; n < N; ++n) {
    const double s = stats.rstd[n];
    Vec xhat(C);
    for (int64_t c = 0; c < C; ++c) xhat[c] = (x[n * C + c] - stats.mean[n]) * s;
    for (int64_t i = 0; i < C; ++i) {
      double dxi = 0.0;
      for (int64_t j = 0; j < C; ++j) {
        const double jac = s * ((i == j ? 1.0 : 0.0) - 1.0 / C) - xhat[i] * xhat[j] * s / C;
        dxi += dout[n * C + j] * gamma[j] * jac;
      }
      g.dx[n * C + i] = dxi;
      g.dgamma[i] += dout[n * C + i] * xhat[i];
      g.dbeta[i] += dout[n * C + i];
    }
  }
  return g;
}

Vec embedding_ref(const std::vector<int32_t>& tokens, const Vec& wte, const Vec& wpe, int64_t T,
                  int64_t C) {
  Vec out(tokens.size() * C);
  for (size_t bt = 0; bt < tokens.size(); ++bt) {
    for (int64_t c = 0; c < C; ++c) {
      out[bt * C + c] = wte[tokens[bt] * C + c] + wpe[(bt % T) * C + c];
    }
  }
  return out;
}

struct CrossEntropyRef {
  Vec losses, dlogits;
};

CrossEntropyRef cross_entropy_ref(const Vec& logits, const std::vector<int32_t>& targets, int64_t V,
                                  double grad_scale) {
  const int64_t N = static_cast<int64_t>(targets.size());
  CrossEntropyRef r{Vec(N), Vec(logits.size())};
  for (int64_t n = 0; n < N; ++n) {
    const double* z = logits.data() + n * V;
    const double m = *std::max_element(z, z + V);
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(z[v] - m);
    r.losses[n] = m + std::log(sum) - z[targets[n]];
    for (int64_t v = 0; v < V; ++v) {
      const double p = std::exp(z[v] - m) / sum;
      r.dlogits[n * V + v] = (p - (v == targets[n] ? 1.0 : 0.0)) * grad_scale;
    }
  }
  return r;
}

// ---------------------------------------------------------------------------------------
// LayerNorm

struct LayerNormCase {
  int64_t N, C;
  DType x_dtype, out_dtype, param_dtype;
  double rtol;
};

TEST(CpuLayerNorm, ForwardMatchesFp64) {
  const LayerNormCase cases[] = {
      {10, 8, DType::kF32, DType::kF32, DType::kF32, 1e-5},
      {70, 100, DType::kF32, DType::kF32, DType::kF32, 1e-5},
      {70, 100, DType::kBF16, DType::kBF16, DType::kBF16, 1e-2},
      {70, 100, DType::kBF16, DType::kF32, DType::kF32, 1e-5},
      {70, 100, DType::kF32, DType::kBF16, DType::kF32, 1e-2},
      {70, 100, DType::kF16, DType::kF16, DType::kF32, 1e-2},
  };
  CpuBackend be;
  Rng rng(1);
  for (const LayerNormCase& k : cases) {
    const std::string what = std::string("x ") + dtype_name(k.x_dtype) + " out " +
                             dtype_name(k.out_dtype) + " C " + std::to_string(k.C);
    // An offset mean makes a one-pass variance lose digits; the op must not.
    Tensor x = make({k.N, k.C}, k.x_dtype, rng.uniform(k.N * k.C, 2.0, 4.0));
    Tensor gamma = make({k.C}, k.param_dtype, rng.uniform(k.C, 0.5, 1.5));
    Tensor beta = make({k.C}, k.param_dtype, rng.uniform(k.C));
    Tensor out = poisoned({k.N, k.C}, k.out_dtype);
    Tensor mean = poisoned({k.N}, DType::kF32);
    Tensor rstd = poisoned({k.N}, DType::kF32);
    be.layernorm_forward(x, gamma, beta, out, mean, rstd);
    const LayerNormRef ref = layernorm_ref(values_of(x), values_of(gamma), values_of(beta), k.C);
    expect_close(values_of(out), ref.out, k.rtol, what + " out");
    // Statistics come from the stored inputs and are kept in FP32 whatever the dtypes.
    expect_close(values_of(mean), ref.mean, 1e-5, what + " mean");
    expect_close(values_of(rstd), ref.rstd, 1e-5, what + " rstd");
  }
}

TEST(CpuLayerNorm, Bf16OutputIsTheF32ResultRoundedOnce) {
  CpuBackend be;
  Rng rng(2);
  const int64_t N = 12, C = 40;
  Tensor x = make({3, 4, C}, DType::kBF16, rng.uniform(N * C));
  Tensor gamma = make({C}, DType::kF32, rng.uniform(C));
  Tensor beta = make({C}, DType::kF32, rng.uniform(C));
  Tensor wide = poisoned({3, 4, C}, DType::kF32);
  Tensor narrow = poisoned({3, 4, C}, DType::kBF16);
  Tensor mean = poisoned({3, 4}, DType::kF32);
  Tensor rstd = poisoned({3, 4}, DType::kF32);
  be.layernorm_forward(x, gamma, beta, wide, mean, rstd);
  be.layernorm_forward(x, gamma, beta, narrow, mean, rstd);
  expect_rounded_once(wide, narrow, "layernorm out");
}

// Runs layernorm_backward on the given tensors after a forward that produces the statistics.
// dx is poisoned; dgamma and dbeta start from `prefill` to check that they accumulate.
LayerNormGrads run_layernorm_backward(CpuBackend& be, const Tensor& x, const Tensor& gamma,
                                      const Tensor& dout, DType dx_dtype, const Vec& prefill) {
  const int64_t C = x.dim(-1), N = x.numel() / C;
  Tensor beta = make({C}, DType::kF32, Vec(C, 0.0));
  Tensor out = poisoned(x.shape(), DType::kF32);
  Tensor mean = poisoned({N}, DType::kF32);
  Tensor rstd = poisoned({N}, DType::kF32);
  be.layernorm_forward(x, gamma, beta, out, mean, rstd);
  Tensor dx = poisoned(x.shape(), dx_dtype);
  Tensor dgamma = make({C}, DType::kF32, prefill);
  Tensor dbeta = make({C}, DType::kF32, prefill);
  be.layernorm_backward(dout, x, gamma, mean, rstd, dx, dgamma, dbeta);
  const Vec start = values_of(make({C}, DType::kF32, prefill));
  return {values_of(dx), add(values_of(dgamma), scaled(start, -1.0)),
          add(values_of(dbeta), scaled(start, -1.0))};
}

TEST(CpuLayerNorm, BackwardMatchesFiniteDifferences) {
  CpuBackend be;
  Rng rng(3);
  const int64_t B = 2, T = 5, C = 8;
  const Shape shape{B, T, C};
  const Tensor x = make(shape, DType::kF32, rng.uniform(B * T * C, -2.0, 2.0));
  const Tensor gamma = make({C}, DType::kF32, rng.uniform(C, 0.5, 1.5));
  const Vec beta = rng.uniform(C);
  const Vec w = values_of(make(shape, DType::kF32, rng.uniform(B * T * C)));  // L = sum(out * w)
  const Vec xv = values_of(x), gv = values_of(gamma);

  const Vec fd_x = finite_difference(
      [&](const Vec& v) { return dot(layernorm_ref(v, gv, beta, C).out, w); }, xv);
  const Vec fd_gamma = finite_difference(
      [&](const Vec& v) { return dot(layernorm_ref(xv, v, beta, C).out, w); }, gv);
  const Vec fd_beta = finite_difference(
      [&](const Vec& v) { return dot(layernorm_ref(xv, gv, v, C).out, w); }, beta);

  const LayerNormGrads ref = layernorm_backward_ref(w, xv, gv, C);
  expect_close(ref.dx, fd_x, 1e-6, "reference dx vs finite differences");
  expect_close(ref.dgamma, fd_gamma, 1e-6, "reference dgamma vs finite differences");
  expect_close(ref.dbeta, fd_beta, 1e-6, "reference dbeta vs finite differences");

  const LayerNormGrads got = run_layernorm_backward(be, x, gamma, make(shape, DType::kF32, w),
                                                    DType::kF32, rng.uniform(C));
  expect_close(got.dx, fd_x, 1e-5, "dx");
  expect_close(got.dgamma, fd_gamma, 1e-5, "dgamma (accumulated)");
  expect_close(got.dbeta, fd_beta, 1e-5, "dbeta (accumulated)");
}

TEST(CpuLayerNorm, BackwardMatchesFp64AtLargerShape) {
  CpuBackend be;
  Rng rng(4);
  // C = 100 is not a multiple of the channel blocks; 300 rows span several of them.
  const int64_t N = 300, C = 100;
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const double rtol = dtype == DType::kF32 ? 1e-5 : 1e-2;
    const std::string what = dtype_name(dtype);
    const Tensor x = make({N, C}, dtype, rng.uniform(N * C, -3.0, 3.0));
    const Tensor gamma = make({C}, dtype, rng.uniform(C, 0.5, 1.5));
    const Tensor dout = make({N, C}, dtype, rng.uniform(N * C));
    const LayerNormGrads ref =
        layernorm_backward_ref(values_of(dout), values_of(x), values_of(gamma), C);
    const LayerNormGrads got = run_layernorm_backward(be, x, gamma, dout, dtype, rng.uniform(C));
    expect_close(got.dx, ref.dx, rtol, what + " dx");
    // Parameter gradients are F32 and summed in FP32 whatever the activation dtype.
    expect_close(got.dgamma, ref.dgamma, 1e-5, what + " dgamma");
    expect_close(got.dbeta, ref.dbeta, 1e-5, what + " dbeta");
  }
}

TEST(CpuLayerNorm, NanInARowStaysInThatRow) {
  CpuBackend be;
  Rng rng(5);
  const int64_t N = 4, C = 16;
  Vec xv = rng.uniform(N * C);
  xv[2 * C + 5] = NAN;
  Tensor x = make({N, C}, DType::kF32, xv);
  Tensor gamma = make({C}, DType::kF32, Vec(C, 1.0));
  Tensor beta = make({C}, DType::kF32, Vec(C, 0.0));
  Tensor out = poisoned({N, C}, DType::kF32);
  Tensor mean = poisoned({N}, DType::kF32);
  Tensor rstd = poisoned({N}, DType::kF32);
  be.layernorm_forward(x, gamma, beta, out, mean, rstd);
  const Vec o = values_of(out);
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < C; ++c) {
      EXPECT_EQ(std::isnan(o[n * C + c]), n == 2) << "row " << n << " channel " << c;
    }
  }
}

// ---------------------------------------------------------------------------------------
// Attention

struct AttentionRun {
  Tensor out, att;
};

AttentionRun run_attention_forward(CpuBackend& be, const Tensor& qkv, const AttnShape& s,
                                   DType out_dtype) {
  AttentionRun r{poisoned(s.out(), out_dtype), poisoned(s.att(), DType::kF32)};
  be.attention_forward(qkv, r.out, r.att, static_cast<int>(s.H));
  return r;
}

Tensor run_attention_backward(CpuBackend& be, const Tensor& qkv, const Tensor& dout,
                              const AttnShape& s, DType dqkv_dtype) {
  const AttentionRun fwd = run_attention_forward(be, qkv, s, DType::kF32);
  Tensor dqkv = poisoned(s.qkv(), dqkv_dtype);
  be.attention_backward(dout, qkv, fwd.att, dqkv, static_cast<int>(s.H));
  return dqkv;
}

TEST(CpuAttention, ForwardMatchesFp64) {
  CpuBackend be;
  Rng rng(6);
  struct Case {
    AttnShape s;
    DType dtype;
    double rtol;
  };
  const Case cases[] = {
      {{2, 5, 8, 2}, DType::kF32, 1e-5},    {{2, 37, 48, 3}, DType::kF32, 1e-5},
      {{2, 37, 48, 3}, DType::kBF16, 1e-2}, {{1, 20, 32, 2}, DType::kF16, 1e-2},
      {{1, 1, 6, 1}, DType::kF32, 1e-5},    {{1, 32, 80, 2}, DType::kF32, 1e-5},
  };
  for (const Case& k : cases) {
    const std::string what = std::string(dtype_name(k.dtype)) + " T " + std::to_string(k.s.T);
    // Scores of a few units make the softmax far from uniform.
    const Tensor qkv = make(k.s.qkv(), k.dtype, rng.uniform(k.s.qkv().numel(), -2.0, 2.0));
    const AttentionRun got = run_attention_forward(be, qkv, k.s, k.dtype);
    const AttentionRef ref = attention_ref(values_of(qkv), k.s);
    expect_close(values_of(got.out), ref.out, k.rtol, what + " out");
    // Probabilities are F32 from FP32 math on the stored inputs (zero above the diagonal).
    expect_close(values_of(got.att), ref.att, 1e-5, what + " att");
  }
}

TEST(CpuAttention, Bf16OutputIsTheF32ResultRoundedOnce) {
  CpuBackend be;
  Rng rng(7);
  const AttnShape s{2, 9, 16, 2};
  const Tensor qkv = make(s.qkv(), DType::kBF16, rng.uniform(s.qkv().numel()));
  const AttentionRun wide = run_attention_forward(be, qkv, s, DType::kF32);
  const AttentionRun narrow = run_attention_forward(be, qkv, s, DType::kBF16);
  expect_rounded_once(wide.out, narrow.out, "attention out");
  EXPECT_TRUE(same_bytes(wide.att, narrow.att));

  const Tensor dout = make(s.out(), DType::kBF16, rng.uniform(s.out().numel()));
  const Tensor dwide = run_attention_backward(be, qkv, dout, s, DType::kF32);
  const Tensor dnarrow = run_attention_backward(be, qkv, dout, s, DType::kBF16);
  expect_rounded_once(dwide, dnarrow, "attention dqkv");
}

TEST(CpuAttention, BackwardMatchesFiniteDifferences) {
  CpuBackend be;
  Rng rng(8);
  const AttnShape s{2, 5, 8, 2};
  const Tensor qkv = make(s.qkv(), DType::kF32, rng.uniform(s.qkv().numel(), -2.0, 2.0));
  const Vec w = values_of(make(s.out(), DType::kF32, rng.uniform(s.out().numel())));
  const Vec qv = values_of(qkv);
  const Vec fd =
      finite_difference([&](const Vec& v) { return dot(attention_ref(v, s).out, w); }, qv);
  expect_close(attention_backward_ref(w, qv, s), fd, 1e-6, "reference dqkv vs finite differences");
  const Tensor dqkv =
      run_attention_backward(be, qkv, make(s.out(), DType::kF32, w), s, DType::kF32);
  expect_close(values_of(dqkv), fd, 1e-5, "dqkv");
}

TEST(CpuAttention, BackwardMatchesFp64AtLargerShape) {
  CpuBackend be;
  Rng rng(9);
  // Head sizes 16 and 40 (three column tiles, the last partial); T = 48 fills whole tiles.
  for (const AttnShape& s : {AttnShape{2, 37, 48, 3}, AttnShape{1, 48, 80, 2}}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      // In BF16 the score gradients dP and dS are BF16 matrices, as in the composed routine
      // (core/ops/attention.h), and dS = P (dP - rowsum(P dP)) can cancel: about four units
      // of BF16's 2^-8 spacing on the scale of dqkv.
      const double rtol = dtype == DType::kF32 ? 1e-5 : 3e-2;
      const Tensor qkv = make(s.qkv(), dtype, rng.uniform(s.qkv().numel(), -2.0, 2.0));
      const Tensor dout = make(s.out(), dtype, rng.uniform(s.out().numel()));
      const Tensor dqkv = run_attention_backward(be, qkv, dout, s, dtype);
      expect_close(values_of(dqkv), attention_backward_ref(values_of(dout), values_of(qkv), s),
                   rtol, std::string(dtype_name(dtype)) + " dqkv, D " + std::to_string(s.D()));
    }
  }
}

TEST(CpuAttention, IsCausalAndPropagatesNan) {
  CpuBackend be;
  Rng rng(10);
  const AttnShape s{1, 6, 8, 2};
  // A NaN in channel 1 of head 0's key or value at position 3 reaches head 0's outputs from
  // position 3 on, never earlier (the mask) nor in head 1. A NaN key poisons the whole score
  // row, hence every channel of the head; a NaN value only its own channel.
  for (int which : {1, 2}) {
    Vec qkv = rng.uniform(s.qkv().numel());
    qkv[s.qkv_index(0, 3, which, 0, 1)] = NAN;
    const AttentionRun got =
        run_attention_forward(be, make(s.qkv(), DType::kF32, qkv), s, DType::kF32);
    const Vec out = values_of(got.out);
    for (int64_t t = 0; t < s.T; ++t) {
      for (int64_t c = 0; c < s.C; ++c) {
        const bool reached = c < s.D() && t >= 3 && (which == 1 || c == 1);
        EXPECT_EQ(std::isnan(out[t * s.C + c]), reached)
            << (which == 1 ? "key" : "value") << ": t " << t << " channel " << c;
      }
    }
  }
}

// The FNV-1a hash of the bytes of the attention op's results (forward and backward) for fixed
// inputs in F32 and BF16, at shapes whose padded widths take both AVX-512 tile widths.
uint64_t attention_digest() {
  CpuBackend be;
  uint64_t hash = 0xcbf29ce484222325ull;
  const auto add = [&hash](const Tensor& t) {
    const auto* bytes = static_cast<const unsigned char*>(t.data());
    for (size_t i = 0; i < t.nbytes(); ++i) hash = (hash ^ bytes[i]) * 0x100000001b3ull;
  };
  Rng rng(12);
  for (const AttnShape& s : {AttnShape{2, 37, 48, 3}, AttnShape{1, 70, 80, 2}}) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      const Tensor qkv = make(s.qkv(), dtype, rng.uniform(s.qkv().numel(), -2.0, 2.0));
      const Tensor dout = make(s.out(), dtype, rng.uniform(s.out().numel()));
      const AttentionRun fwd = run_attention_forward(be, qkv, s, dtype);
      Tensor dqkv = poisoned(s.qkv(), dtype);
      be.attention_backward(dout, qkv, fwd.att, dqkv, static_cast<int>(s.H));
      add(fwd.out);
      add(fwd.att);
      add(dqkv);
    }
  }
  return hash;
}

// Run by the test below in a child process.
TEST(CpuAttention, DISABLED_PrintDigest) {
  std::printf("attention digest %016llx\n", static_cast<unsigned long long>(attention_digest()));
}

// The attention products run AVX-512 tiles where MANTISSA_CPU_AVX512_CONVERT allows, else AVX2
// ones; both sum each element in the same order, so the results must be the same bits. This
// process's digest against that of this test binary run with the switch flipped.
TEST(CpuAttention, SameBitsOnTheAvx2AndAvx512Paths) {
  // The AVX-512 path needs all four (cpu_narrow_avx512.cpp); with one missing, both runs
  // would take the AVX2 path and compare it with itself.
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512dq")) {
    GTEST_SKIP() << "no AVX-512 F, BW, VL and DQ on this CPU: one path only";
  }
  const char* setting = std::getenv("MANTISSA_CPU_AVX512_CONVERT");
  const bool off_here = setting != nullptr && std::string(setting) == "0";
  char self[4096] = {};
  ASSERT_GT(readlink("/proc/self/exe", self, sizeof self - 1), 0);
  const std::string command = std::string("MANTISSA_CPU_AVX512_CONVERT=") + (off_here ? "1" : "0") +
                              " '" + self +
                              "' --gtest_filter=CpuAttention.DISABLED_PrintDigest "
                              "--gtest_also_run_disabled_tests 2>&1";
  FILE* child = popen(command.c_str(), "r");
  ASSERT_NE(child, nullptr) << command;
  std::string output;
  char buffer[512];
  while (std::fgets(buffer, sizeof buffer, child) != nullptr) output += buffer;
  ASSERT_EQ(pclose(child), 0) << command << "\n" << output;
  char expected[64];
  std::snprintf(expected, sizeof expected, "attention digest %016llx",
                static_cast<unsigned long long>(attention_digest()));
  EXPECT_NE(output.find(expected), std::string::npos)
      << "this process (" << expected << ") against " << command << ":\n"
      << output;
}

// ---------------------------------------------------------------------------------------
// Embeddings

TEST(CpuEmbedding, ForwardMatchesFp64) {
  CpuBackend be;
  Rng rng(11);
  const int64_t B = 3, T = 7, V = 13, maxT = 10, C = 40;
  const std::vector<int32_t> tokens = rng.indices(B * T, V);
  for (DType param : {DType::kF32, DType::kBF16}) {
    for (DType act : {DType::kF32, DType::kBF16}) {
      const Tensor wte = make({V, C}, param, rng.uniform(V * C));
      const Tensor wpe = make({maxT, C}, param, rng.uniform(maxT * C));
      Tensor out = poisoned({B, T, C}, act);
      be.embedding_forward(make_indices({B, T}, tokens), wte, wpe, out);
      expect_close(values_of(out), embedding_ref(tokens, values_of(wte), values_of(wpe), T, C),
                   act == DType::kF32 ? 1e-7 : 1e-2,
                   std::string("wte ") + dtype_name(param) + " out " + dtype_name(act));
    }
  }
}

TEST(CpuEmbedding, BackwardMatchesFiniteDifferencesAndAccumulates) {
  CpuBackend be;
  Rng rng(12);
  const int64_t B = 2, T = 5, V = 11, maxT = 7, C = 8;
  // Repeated tokens (3, 7, 10) sum their gradients; tokens 2, 4, 5, 6, 8, 9 and positions 5
  // and 6 are unused, so their rows must keep the pre-filled values bit for bit.
  const std::vector<int32_t> tokens = {3, 7, 3, 0, 10, 7, 7, 1, 3, 10};
  const Vec wte = values_of(make({V, C}, DType::kF32, rng.uniform(V * C)));
  const Vec wpe = values_of(make({maxT, C}, DType::kF32, rng.uniform(maxT * C)));
  const Vec w = values_of(make({B, T, C}, DType::kF32, rng.uniform(B * T * C)));
  const Vec fd_wte = finite_difference(
      [&](const Vec& v) { return dot(embedding_ref(tokens, v, wpe, T, C), w); }, wte);
  const Vec fd_wpe = finite_difference(
      [&](const Vec& v) { return dot(embedding_ref(tokens, wte, v, T, C), w); }, wpe);

  const Tensor prefill_wte = make({V, C}, DType::kF32, rng.uniform(V * C));
  const Tensor prefill_wpe = make({maxT, C}, DType::kF32, rng.uniform(maxT * C));
  Tensor dwte = make({V, C}, DType::kF32, values_of(prefill_wte));
  Tensor dwpe = make({maxT, C}, DType::kF32, values_of(prefill_wpe));
  be.embedding_backward(make({B, T, C}, DType::kF32, w), make_indices({B, T}, tokens), dwte, dwpe);
  expect_close(add(values_of(dwte), scaled(values_of(prefill_wte), -1.0)), fd_wte, 1e-5, "dwte");
  expect_close(add(values_of(dwpe), scaled(values_of(prefill_wpe), -1.0)), fd_wpe, 1e-5, "dwpe");
  for (int64_t v : {2, 4, 5, 6, 8, 9}) {
    EXPECT_EQ(std::memcmp(dwte.data_as<float>() + v * C, prefill_wte.data_as<float>() + v * C,
                          C * sizeof(float)),
              0)
        << "unused token row " << v << " changed";
  }
  EXPECT_EQ(std::memcmp(dwpe.data_as<float>() + T * C, prefill_wpe.data_as<float>() + T * C,
                        (maxT - T) * C * sizeof(float)),
            0)
      << "unused position rows changed";
}

// Without a position table (Llama: RoPE supplies positions) the output is the token's row,
// rounded once, and the token rows' gradients are those of the op with positions.
TEST(CpuEmbedding, WithoutPositionTable) {
  CpuBackend be;
  Rng rng(14);
  const int64_t B = 2, T = 6, V = 9, C = 24;
  const std::vector<int32_t> tokens = rng.indices(B * T, V);
  const Tensor indices = make_indices({B, T}, tokens);
  const Tensor wte = make({V, C}, DType::kF32, rng.uniform(V * C));
  for (DType act : {DType::kF32, DType::kBF16}) {
    Tensor out = poisoned({B, T, C}, act);
    be.embedding_forward(indices, wte, Tensor(), out);
    Tensor expected = poisoned({B, T, C}, DType::kF32);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      std::memcpy(expected.data_as<float>() + bt * C, wte.data_as<float>() + tokens[bt] * C,
                  C * sizeof(float));
    }
    if (act == DType::kF32) {
      EXPECT_TRUE(same_bytes(out, expected));
    } else {
      expect_rounded_once(expected, out, "out BF16");
    }
  }

  const Tensor dout = make({B, T, C}, DType::kF32, rng.uniform(B * T * C));
  const Vec prefill = rng.uniform(V * C);
  Tensor dwte = make({V, C}, DType::kF32, prefill);
  Tensor no_positions;
  be.embedding_backward(dout, indices, dwte, no_positions);
  Tensor dwte_with = make({V, C}, DType::kF32, prefill);
  Tensor dwpe = make({T, C}, DType::kF32, Vec(T * C, 0.0));
  be.embedding_backward(dout, indices, dwte_with, dwpe);
  EXPECT_TRUE(same_bytes(dwte, dwte_with));
}

TEST(CpuEmbedding, BackwardMatchesFp64AtLargerShape) {
  CpuBackend be;
  Rng rng(13);
  // C = 100 leaves a partial channel block; V = 17 over 512 positions repeats every token.
  const int64_t B = 4, T = 128, V = 17, C = 100;
  const std::vector<int32_t> tokens = rng.indices(B * T, V);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Tensor dout = make({B, T, C}, dtype, rng.uniform(B * T * C));
    const Vec dy = values_of(dout);
    Vec ref_wte(V * C, 0.0), ref_wpe(T * C, 0.0);
    for (int64_t bt = 0; bt < B * T; ++bt) {
      for (int64_t c = 0; c < C; ++c) {
        ref_wte[tokens[bt] * C + c] += dy[bt * C + c];
        ref_wpe[(bt % T) * C + c] += dy[bt * C + c];
      }
    }
    Tensor dwte = make({V, C}, DType::kF32, Vec(V * C, 0.0));
    Tensor dwpe = make({T, C}, DType::kF32, Vec(T * C, 0.0));
    be.embedding_backward(dout, make_indices({B, T}, tokens), dwte, dwpe);
    // Sums of up to ~60 FP32 terms.
    expect_close(values_of(dwte), ref_wte, 1e-5, std::string(dtype_name(dtype)) + " dwte");
    expect_close(values_of(dwpe), ref_wpe, 1e-5, std::string(dtype_name(dtype)) + " dwpe");
  }
}

// ---------------------------------------------------------------------------------------
// Softmax cross-entropy

TEST(CpuCrossEntropy, MatchesFp64AndFiniteDifferences) {
  CpuBackend be;
  Rng rng(14);
  const int64_t N = 10, V = 11;
  const double grad_scale = 0.37;  // not a power of two, so a missing factor shows
  const std::vector<int32_t> targets = rng.indices(N, V);
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const double rtol = dtype == DType::kF32 ? 1e-5 : 1e-2;
    const std::string what = dtype_name(dtype);
    const Tensor logits = make({2, 5, V}, dtype, rng.uniform(N * V, -4.0, 4.0));
    const Vec lv = values_of(logits);
    Tensor losses = poisoned({2, 5}, DType::kF32);
    Tensor dlogits = poisoned({2, 5, V}, dtype);
    be.softmax_cross_entropy(logits, V, make_indices({2, 5}, targets), losses, &dlogits,
                             static_cast<float>(grad_scale));
    const CrossEntropyRef ref = cross_entropy_ref(lv, targets, V, grad_scale);
    // The loss is FP32 math on the stored logits whatever their dtype.
    expect_close(values_of(losses), ref.losses, 1e-5, what + " losses");
    expect_close(values_of(dlogits), ref.dlogits, rtol, what + " dlogits");

    const Vec fd = finite_difference(
        [&](const Vec& v) {
          const Vec l = cross_entropy_ref(v, targets, V, 1.0).losses;
          return std::accumulate(l.begin(), l.end(), 0.0);
        },
        lv);
    expect_close(ref.dlogits, scaled(fd, grad_scale), 1e-6,
                 what + " reference vs finite differences");
    expect_close(values_of(dlogits), scaled(fd, grad_scale), rtol,
                 what + " dlogits vs finite differences");
  }
}

TEST(CpuCrossEntropy, LargeVocabularyAndLossOnly) {
  CpuBackend be;
  Rng rng(15);
  const int64_t N = 6, V = 5000;
  const std::vector<int32_t> targets = rng.indices(N, static_cast<int32_t>(V));
  // Large logits: without the max shift exp would overflow FP32.
  const Tensor logits = make({N, V}, DType::kF32, rng.uniform(N * V, 60.0, 100.0));
  Tensor losses = poisoned({N}, DType::kF32);
  be.softmax_cross_entropy(logits, V, make_indices({N}, targets), losses, nullptr, 1.0f);
  expect_close(values_of(losses), cross_entropy_ref(values_of(logits), targets, V, 1.0).losses,
               1e-5, "losses");
}

// Logits far from zero: the loss is logsumexp(z) - z[target], a difference of two numbers near
// 1e6, where an FP32 ulp is 0.0625; computed as max - z[target] (exact) + log(sum) it keeps the
// precision of a loss near zero.
TEST(CpuCrossEntropy, LossKeepsItsPrecisionForLogitsFarFromZero) {
  CpuBackend be;
  Rng rng(18);
  const int64_t N = 6, V = 300;
  const std::vector<int32_t> targets = rng.indices(N, static_cast<int32_t>(V));
  for (double offset : {1e6, -1e6}) {
    Vec lv = rng.uniform(N * V, -8.0, 8.0);
    for (double& v : lv) v += offset;
    const Tensor logits = make({N, V}, DType::kF32, lv);
    Tensor losses = poisoned({N}, DType::kF32);
    be.softmax_cross_entropy(logits, V, make_indices({N}, targets), losses, nullptr, 1.0f);
    expect_close(values_of(losses), cross_entropy_ref(values_of(logits), targets, V, 1.0).losses,
                 1e-5, "losses at offset " + std::to_string(offset));
  }
}

// GPT-2's vocabulary: 50,257 terms of similar size in each row's sum. Each probability (the
// gradient, grad_scale 1, away from the target) stays within 1e-6 relative of FP64: measured
// 2.2e-7, where a running FP32 sum over each row gave 5.4e-6.
TEST(CpuCrossEntropy, GptVocabularyRowsStayNearFp64) {
  CpuBackend be;
  Rng rng(17);
  const int64_t N = 4, V = 50257;
  const std::vector<int32_t> targets = rng.indices(N, static_cast<int32_t>(V));
  const Tensor logits = make({N, V}, DType::kF32, rng.uniform(N * V, -1.0, 1.0));
  Tensor losses = poisoned({N}, DType::kF32);
  Tensor dlogits = poisoned({N, V}, DType::kF32);
  be.softmax_cross_entropy(logits, V, make_indices({N}, targets), losses, &dlogits, 1.0f);
  const CrossEntropyRef ref = cross_entropy_ref(values_of(logits), targets, V, 1.0);
  expect_close(values_of(losses), ref.losses, 1e-6, "losses");
  const Vec got = values_of(dlogits);
  double worst = 0.0;
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t v = 0; v < V; ++v) {
      if (v == targets[n]) continue;
      const double want = ref.dlogits[n * V + v];
      worst = worse_error(worst, std::fabs(got[n * V + v] - want) / want);
    }
  }
  EXPECT_LT(worst, 1e-6) << "largest relative error of a probability";
}

TEST(CpuCrossEntropy, DlogitsMayAliasLogits) {
  CpuBackend be;
  Rng rng(16);
  const int64_t N = 9, V = 70;
  const std::vector<int32_t> targets = rng.indices(N, static_cast<int32_t>(V));
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const Vec lv = rng.uniform(N * V, -3.0, 3.0);
    const Tensor logits = make({N, V}, dtype, lv);
    Tensor losses = poisoned({N}, DType::kF32);
    Tensor dlogits = poisoned({N, V}, dtype);
    be.softmax_cross_entropy(logits, V, make_indices({N}, targets), losses, &dlogits, 0.25f);

    Tensor in_place = make({N, V}, dtype, lv);
    Tensor losses_in_place = poisoned({N}, DType::kF32);
    be.softmax_cross_entropy(in_place, V, make_indices({N}, targets), losses_in_place, &in_place,
                             0.25f);
    EXPECT_TRUE(same_bytes(in_place, dlogits)) << dtype_name(dtype);
    EXPECT_TRUE(same_bytes(losses_in_place, losses)) << dtype_name(dtype);
  }
}

TEST(CpuCrossEntropy, NanLogitGivesNanLossInItsRowOnly) {
  CpuBackend be;
  Rng rng(17);
  const int64_t N = 4, V = 9;
  Vec lv = rng.uniform(N * V);
  lv[1 * V + 6] = NAN;
  const std::vector<int32_t> targets = {0, 2, 8, 5};  // the NaN is not the target's logit
  Tensor losses = poisoned({N}, DType::kF32);
  Tensor dlogits = poisoned({N, V}, DType::kF32);
  be.softmax_cross_entropy(make({N, V}, DType::kF32, lv), V, make_indices({N}, targets), losses,
                           &dlogits, 1.0f);
  const Vec l = values_of(losses);
  const Vec d = values_of(dlogits);
  for (int64_t n = 0; n < N; ++n) {
    EXPECT_EQ(std::isnan(l[n]), n == 1) << "row " << n;
    for (int64_t v = 0; v < V; ++v) EXPECT_EQ(std::isnan(d[n * V + v]), n == 1) << n << ", " << v;
  }
}

// A padded vocabulary (GPT-2's 50257 in 50304 columns): only the first valid_cols columns are
// the softmax's. Each row's loss and gradient are bit-identical to the op's on an unpadded
// copy of those columns, whatever the padding holds (huge, infinite, NaN), and the padding's
// gradient is exactly +0: with a separate dlogits, in place, and for the loss alone.
TEST(CpuCrossEntropy, PaddingColumnsAreOutsideTheSoftmax) {
  CpuBackend be;
  Rng rng(19);
  const int64_t N = 7, V = 200, Vp = 256;
  std::vector<int32_t> target_values = rng.indices(N, static_cast<int32_t>(V));
  target_values[0] = static_cast<int32_t>(V - 1);  // the last valid column
  const Tensor targets = make_indices({N}, target_values);
  const Vec real = rng.uniform(N * V, -4.0, 4.0);
  const double junk[] = {1e30, INFINITY, NAN, -INFINITY, 0.0, 80.0};
  Vec padded(static_cast<size_t>(N * Vp));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t v = 0; v < Vp; ++v)
      padded[n * Vp + v] = v < V ? real[n * V + v] : junk[(n + v) % 6];
  const float grad_scale = 0.37f;

  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string what = dtype_name(dtype);
    Tensor ref_losses = poisoned({N}, DType::kF32), ref_dlogits = poisoned({N, V}, dtype);
    be.softmax_cross_entropy(make({N, V}, dtype, real), V, targets, ref_losses, &ref_dlogits,
                             grad_scale);

    const Tensor logits = make({N, Vp}, dtype, padded);
    Tensor losses = poisoned({N}, DType::kF32), dlogits = poisoned({N, Vp}, dtype);
    be.softmax_cross_entropy(logits, V, targets, losses, &dlogits, grad_scale);
    EXPECT_TRUE(same_bytes(losses, ref_losses)) << what;
    Tensor in_place = make({N, Vp}, dtype, padded);
    Tensor losses_in_place = poisoned({N}, DType::kF32);
    be.softmax_cross_entropy(in_place, V, targets, losses_in_place, &in_place, grad_scale);
    EXPECT_TRUE(same_bytes(losses_in_place, ref_losses)) << what << " in place";
    Tensor loss_only = poisoned({N}, DType::kF32);
    be.softmax_cross_entropy(logits, V, targets, loss_only, nullptr, grad_scale);
    EXPECT_TRUE(same_bytes(loss_only, ref_losses)) << what << " loss only";

    for (const Tensor* d : {&dlogits, &in_place}) {
      for (int64_t n = 0; n < N; ++n) {
        for (int64_t v = 0; v < Vp; ++v) {
          const uint64_t expected = v < V ? code_at(ref_dlogits, n * V + v) : 0;  // +0
          ASSERT_EQ(code_at(*d, n * Vp + v), expected)
              << what << (d == &in_place ? " in place" : "") << ", row " << n << ", column " << v;
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Properties shared by all the ops

// Every reduction runs in an order fixed by the data, so the thread count cannot change a
// single bit (the embedding and LayerNorm parameter gradients in particular).
TEST(CpuLayers, ResultsDoNotDependOnTheThreadCount) {
  CpuBackend be;
  Rng rng(18);
  const AttnShape s{2, 33, 64, 4};
  const int64_t BT = s.B * s.T, C = s.C, V = 29;
  const Tensor x = make({BT, C}, DType::kBF16, rng.uniform(BT * C));
  const Tensor gamma = make({C}, DType::kF32, rng.uniform(C));
  const Tensor beta = make({C}, DType::kF32, rng.uniform(C));
  const Tensor dy = make({BT, C}, DType::kBF16, rng.uniform(BT * C));
  const Tensor qkv = make(s.qkv(), DType::kBF16, rng.uniform(s.qkv().numel()));
  const Tensor tokens = make_indices({s.B, s.T}, rng.indices(BT, static_cast<int32_t>(V)));
  const Tensor logits = make({BT, V}, DType::kF32, rng.uniform(BT * V, -3.0, 3.0));
  const Tensor targets = make_indices({BT}, rng.indices(BT, static_cast<int32_t>(V)));

  auto run_all = [&] {
    Tensor out = poisoned({BT, C}, DType::kBF16), mean = poisoned({BT}, DType::kF32),
           rstd = poisoned({BT}, DType::kF32);
    be.layernorm_forward(x, gamma, beta, out, mean, rstd);
    Tensor dx = poisoned({BT, C}, DType::kBF16);
    Tensor dgamma = make({C}, DType::kF32, Vec(C, 0.0)),
           dbeta = make({C}, DType::kF32, Vec(C, 0.0));
    be.layernorm_backward(dy, x, gamma, mean, rstd, dx, dgamma, dbeta);
    const AttentionRun attn = run_attention_forward(be, qkv, s, DType::kBF16);
    const Tensor dqkv = run_attention_backward(be, qkv, dy.reshape(s.out()), s, DType::kBF16);
    Tensor dwte = make({V, C}, DType::kF32, Vec(V * C, 0.0));
    Tensor dwpe = make({s.T, C}, DType::kF32, Vec(s.T * C, 0.0));
    be.embedding_backward(dy.reshape(s.out()), tokens, dwte, dwpe);
    Tensor losses = poisoned({BT}, DType::kF32), dlogits = poisoned({BT, V}, DType::kF32);
    be.softmax_cross_entropy(logits, V, targets, losses, &dlogits, 1.0f);
    return std::vector<Tensor>{out,      mean, rstd, dx,   dgamma, dbeta,  attn.out,
                               attn.att, dqkv, dwte, dwpe, losses, dlogits};
  };
  std::vector<Tensor> one, three;
  with_threads(1, [&] { one = run_all(); });
  with_threads(3, [&] { three = run_all(); });
  ASSERT_EQ(one.size(), three.size());
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_TRUE(same_bytes(one[i], three[i])) << "result " << i;
  }
}

TEST(CpuLayers, BadArgumentsThrowNamingTheOp) {
  CpuBackend be;
  const int64_t C = 8;
  Tensor x = make({4, C}, DType::kF32, Vec(4 * C, 1.0));
  Tensor gamma = make({C}, DType::kF32, Vec(C, 1.0));
  Tensor mean = poisoned({4}, DType::kF32), rstd = poisoned({4}, DType::kF32);
  Tensor out = poisoned({4, C}, DType::kF32);
  Tensor short_param = make({C - 1}, DType::kF32, Vec(C - 1, 1.0));
  expect_error([&] { be.layernorm_forward(x, short_param, gamma, out, mean, rstd); },
               {"layernorm_forward", "gamma", "[7]"});
  Tensor wide_out = poisoned({4, C + 1}, DType::kF32);
  expect_error([&] { be.layernorm_forward(x, gamma, gamma, wide_out, mean, rstd); },
               {"layernorm_forward", "out"});
  Tensor short_mean = poisoned({3}, DType::kF32);
  expect_error([&] { be.layernorm_forward(x, gamma, gamma, out, short_mean, rstd); },
               {"layernorm_forward", "mean"});
  Tensor ints = Tensor::empty({4, C}, DType::kI32);
  expect_error([&] { be.layernorm_forward(ints, gamma, gamma, out, mean, rstd); },
               {"layernorm_forward", "x", "dtype"});
  Tensor bf16_grad = poisoned({C}, DType::kBF16);
  Tensor dx = poisoned({4, C}, DType::kF32);
  expect_error([&] { be.layernorm_backward(x, x, gamma, mean, rstd, dx, bf16_grad, gamma); },
               {"layernorm_backward", "dgamma"});
  // dgamma and dbeta are summed from dout and x after dx is written: dx over either of them
  // would change those sums.
  Tensor dout = make({4, C}, DType::kF32, Vec(4 * C, 0.5));
  Tensor dgamma = make({C}, DType::kF32, Vec(C, 0.0)), dbeta = make({C}, DType::kF32, Vec(C, 0.0));
  expect_error([&] { be.layernorm_backward(dout, x, gamma, mean, rstd, dout, dgamma, dbeta); },
               {"layernorm_backward", "dx", "overlaps dout"});
  expect_error([&] { be.layernorm_backward(dout, x, gamma, mean, rstd, x, dgamma, dbeta); },
               {"layernorm_backward", "dx", "overlaps x"});

  const AttnShape s{1, 4, 8, 2};
  Tensor qkv = make(s.qkv(), DType::kF32, Vec(s.qkv().numel(), 0.5));
  Tensor att = poisoned(s.att(), DType::kF32);
  Tensor attn_out = poisoned(s.out(), DType::kF32);
  expect_error([&] { be.attention_forward(qkv, attn_out, att, 3); },
               {"attention_forward", "n_head = 3"});
  expect_error([&] { be.attention_forward(qkv, attn_out, att, 0); },
               {"attention_forward", "n_head = 0"});
  Tensor not_3c = poisoned({1, 4, 25}, DType::kF32);
  expect_error([&] { be.attention_forward(not_3c, attn_out, att, 2); },
               {"attention_forward", "qkv"});
  Tensor no_channels = poisoned({1, 4, 0}, DType::kF32);
  expect_error([&] { be.attention_forward(no_channels, attn_out, att, 2); },
               {"attention_forward", "qkv", "no channels"});
  Tensor small_att = poisoned({1, 2, 4, 3}, DType::kF32);
  expect_error([&] { be.attention_forward(qkv, attn_out, small_att, 2); },
               {"attention_forward", "att", "[1, 2, 4, 4]"});
  Tensor e4m3_att = Tensor::empty(s.att(), DType::kE4M3);
  expect_error([&] { be.attention_forward(qkv, attn_out, e4m3_att, 2); },
               {"attention_forward", "att", "dtype"});
  Tensor dqkv_wrong = poisoned({1, 4, 30}, DType::kF32);
  expect_error([&] { be.attention_backward(attn_out, qkv, att, dqkv_wrong, 2); },
               {"attention_backward", "dqkv"});
  // Outputs that share memory with an input: in place would be fine on one backend only.
  Tensor qkv_copy = make(s.qkv(), DType::kF32, Vec(s.qkv().numel(), 0.5));
  expect_error([&] { be.attention_backward(attn_out, qkv_copy, att, qkv_copy, 2); },
               {"attention_backward", "dqkv", "overlaps qkv"});
  Tensor out_in_qkv = qkv_copy.view(0, s.out());
  expect_error([&] { be.attention_forward(qkv_copy, out_in_qkv, att, 2); },
               {"attention_forward", "out", "overlaps qkv"});

  const int64_t V = 11;
  Tensor wte = make({V, C}, DType::kF32, Vec(V * C, 1.0));
  Tensor wpe = make({5, C}, DType::kF32, Vec(5 * C, 1.0));
  Tensor emb = poisoned({2, 5, C}, DType::kF32);
  Tensor bad_tokens = make_indices({2, 5}, {0, 1, 2, 3, 4, 5, 6, 7, 11, 9});
  expect_error([&] { be.embedding_forward(bad_tokens, wte, wpe, emb); },
               {"embedding_forward", "token 11", "position [1, 3]", "[0, 11)"});
  Tensor negative = make_indices({2, 5}, {0, -1, 2, 3, 4, 5, 6, 7, 8, 9});
  expect_error([&] { be.embedding_forward(negative, wte, wpe, emb); },
               {"embedding_forward", "token -1", "[0, 1]"});
  Tensor dwte = make({V, C}, DType::kF32, Vec(V * C, 0.0));
  Tensor dwpe = make({5, C}, DType::kF32, Vec(5 * C, 0.0));
  expect_error([&] { be.embedding_backward(emb, bad_tokens, dwte, dwpe); },
               {"embedding_backward", "token 11", "[1, 3]"});
  EXPECT_TRUE(std::all_of(dwte.data_as<float>(), dwte.data_as<float>() + V * C, [](float v) {
    return v == 0.0f;
  })) << "a rejected call must not have written anything";
  Tensor tokens = make_indices({2, 6}, std::vector<int32_t>(12, 0));
  Tensor long_out = poisoned({2, 6, C}, DType::kF32);
  expect_error([&] { be.embedding_forward(tokens, wte, wpe, long_out); },
               {"embedding_forward", "wpe", "positions"});
  Tensor bf16_dwte = poisoned({V, C}, DType::kBF16);
  Tensor good_tokens = make_indices({2, 5}, std::vector<int32_t>(10, 1));
  expect_error([&] { be.embedding_backward(emb, good_tokens, bf16_dwte, dwpe); },
               {"embedding_backward", "dwte"});

  Tensor logits = make({3, V}, DType::kF32, Vec(3 * V, 0.0));
  Tensor losses = poisoned({3}, DType::kF32);
  Tensor bad_targets = make_indices({3}, {0, 11, 2});
  Tensor targets_of_logits = make_indices({3}, {0, 10, 2});
  expect_error([&] { be.softmax_cross_entropy(logits, V, bad_targets, losses, nullptr, 1.0f); },
               {"softmax_cross_entropy", "target 11", "position [1]", "[0, 11)"});
  expect_error(
      [&] { be.softmax_cross_entropy(logits, 0, targets_of_logits, losses, nullptr, 1.0f); },
      {"softmax_cross_entropy", "valid_cols = 0", "[1, 11]"});
  expect_error(
      [&] { be.softmax_cross_entropy(logits, V + 1, targets_of_logits, losses, nullptr, 1.0f); },
      {"softmax_cross_entropy", "valid_cols = 12", "[1, 11]"});
  // A target in the padding: a valid index into logits, but not into the vocabulary.
  Tensor padding_target = make_indices({3}, {0, 10, 2});
  expect_error(
      [&] { be.softmax_cross_entropy(logits, V - 1, padding_target, losses, nullptr, 1.0f); },
      {"softmax_cross_entropy", "target 10", "position [1]", "[0, 10)"});
  Tensor short_targets = make_indices({2}, {0, 1});
  expect_error([&] { be.softmax_cross_entropy(logits, V, short_targets, losses, nullptr, 1.0f); },
               {"softmax_cross_entropy", "targets"});
  Tensor shifted = logits.view(1, {2, V});
  Tensor overlapping = logits.view(0, {2, V});
  Tensor two_targets = make_indices({2}, {0, 1});
  Tensor two_losses = poisoned({2}, DType::kF32);
  expect_error(
      [&] { be.softmax_cross_entropy(shifted, V, two_targets, two_losses, &overlapping, 1.0f); },
      {"softmax_cross_entropy", "dlogits", "overlaps"});
}

// Probabilities saved in BF16 are exactly the FP32 ones rounded once, the forward output is
// P V with P as saved (as the composed routine's GEMM reads att, core/ops/attention.h), and
// the backward reads back exactly what was saved.
TEST(CpuLayers, AttentionSavesProbabilitiesInReducedPrecision) {
  CpuBackend be;
  const int64_t B = 2, T = 7, C = 8, H = 2;
  std::mt19937 rng(17);
  std::normal_distribution<float> normal;
  Tensor qkv = Tensor::empty(Shape{B, T, 3 * C}, DType::kF32);
  Tensor dout = Tensor::empty(Shape{B, T, C}, DType::kF32);
  for (int64_t i = 0; i < qkv.numel(); ++i) qkv.data_as<float>()[i] = normal(rng);
  for (int64_t i = 0; i < dout.numel(); ++i) dout.data_as<float>()[i] = normal(rng);

  Tensor out32 = Tensor::empty(Shape{B, T, C}, DType::kF32);
  Tensor out16 = Tensor::empty(Shape{B, T, C}, DType::kF32);
  Tensor att32 = Tensor::empty(Shape{B, H, T, T}, DType::kF32);
  Tensor att16 = Tensor::empty(Shape{B, H, T, T}, DType::kBF16);
  be.attention_forward(qkv, out32, att32, static_cast<int>(H));
  be.attention_forward(qkv, out16, att16, static_cast<int>(H));
  Tensor rounded = Tensor::empty(att32.shape(), DType::kF32);
  for (int64_t i = 0; i < att32.numel(); ++i) {
    const bf16 r = bf16_from_float(att32.data_as<float>()[i]);
    ASSERT_EQ(att16.data_as<bf16>()[i].bits, r.bits) << "att element " << i;
    rounded.data_as<float>()[i] = bf16_to_float(r);
  }
  // The rounded probabilities times V in FP64: out16 within FP32 rounding of it (the
  // unrounded ones differ by about 2^-9 relative).
  const int64_t D = C / H;
  Vec from_saved(static_cast<size_t>(out16.numel()), 0.0);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      for (int64_t t = 0; t < T; ++t) {
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const double p = rounded.data_as<float>()[((b * H + h) * T + t) * T + t2];
          for (int64_t d = 0; d < D; ++d) {
            from_saved[(b * T + t) * C + h * D + d] +=
                p * qkv.data_as<float>()[(b * T + t2) * 3 * C + 2 * C + h * D + d];
          }
        }
      }
    }
  }
  expect_close(values_of(out16), from_saved, 1e-6, "out from the saved probabilities");

  Tensor from16 = Tensor::empty(qkv.shape(), DType::kF32);
  Tensor from_rounded = Tensor::empty(qkv.shape(), DType::kF32);
  be.attention_backward(dout, qkv, att16, from16, static_cast<int>(H));
  be.attention_backward(dout, qkv, rounded, from_rounded, static_cast<int>(H));
  EXPECT_EQ(std::memcmp(from16.data(), from_rounded.data(), from16.nbytes()), 0);
}

}  // namespace
}  // namespace mantissa::core
