// Causal attention composed from Backend ops (core/ops/attention.h), on the CPU backend:
//  - its primitives against FP64: split_heads and merge_heads (an exact permutation, or
//    rounded once into another dtype, and each other's inverse; merge_heads also against
//    finite differences of split_heads, whose backward it is), causal_softmax_forward and
//    causal_softmax_backward (the backward also against finite differences of the FP64
//    forward), in place and not, with NaN planted above the diagonal;
//  - the online softmax pieces that the CUDA kernel uses (core/ops/math/softmax.h) against
//    the two-pass max and sum, special values included;
//  - the whole routine against the FP64 reference of tests/core/attention_reference.h:
//    forward, backward, the backward against finite differences, odd T and D, several
//    batches and heads, F32, BF16 and F16, mixed operand dtypes;
//  - the routine against the CPU backend's fused attention op, which rounds at the same
//    points: the same function up to the order of the FP32 sums;
//  - how a NaN travels through it, and argument errors of the primitives.
// Outputs are poisoned with NaN first, so an element an op forgets to write cannot pass.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/math/softmax.h"
#include "tests/common/test_util.h"
#include "tests/core/attention_reference.h"
#include "tests/core/fp64_reference.h"

namespace mantissa::core {
namespace {

// ---------------------------------------------------------------------------------------
// split_heads and merge_heads

// heads[p, b, h, t, d] = rows[b, t, (p H + h) D + d] in FP64.
Vec split_ref(const Vec& rows, int64_t P, int64_t B, int64_t H, int64_t T, int64_t D) {
  Vec heads(rows.size());
  for (int64_t p = 0; p < P; ++p)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d)
            heads[(((p * B + b) * H + h) * T + t) * D + d] =
                rows[((b * T + t) * P + p) * H * D + h * D + d];
  return heads;
}

TEST(AttentionPrimitives, SplitAndMergeHeadsArePermutations) {
  CpuBackend be;
  std::mt19937_64 rng(1);
  struct Case {
    int64_t P, B, H, T, D;
  };
  for (const Case& c : {Case{3, 2, 3, 5, 7}, Case{1, 2, 2, 9, 8}, Case{3, 1, 1, 1, 1}}) {
    const Shape rows_shape{c.B, c.T, c.P * c.H * c.D};
    const Shape heads_shape{c.P, c.B, c.H, c.T, c.D};
    for (DType in : {DType::kF32, DType::kBF16, DType::kF16}) {
      const Tensor rows = make(rows_shape, in, uniform(rng, rows_shape.numel(), -3.0, 3.0));
      const Vec expected = split_ref(values_of(rows), c.P, c.B, c.H, c.T, c.D);
      for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
        const std::string what = std::string(dtype_name(in)) + " -> " + dtype_name(out) + " P " +
                                 std::to_string(c.P) + " D " + std::to_string(c.D);
        Tensor heads = poisoned(heads_shape, out);
        be.split_heads(rows, heads);
        // Each element is the input rounded once into out's dtype (exact when as wide).
        for (int64_t i = 0; i < heads.numel(); ++i) {
          ASSERT_EQ(code_at(heads, i), encode(out, static_cast<float>(expected[i])))
              << what << ": heads element " << i;
        }
        Tensor back = poisoned(rows_shape, in);
        be.merge_heads(heads, back);
        if (out == in) {
          EXPECT_TRUE(same_bytes(back, rows)) << what << ": merge_heads(split_heads(x)) != x";
        } else {
          const Vec round_trip = split_ref(values_of(back), c.P, c.B, c.H, c.T, c.D);
          for (int64_t i = 0; i < heads.numel(); ++i) {
            ASSERT_EQ(encode(in, static_cast<float>(value_at(heads, i))),
                      encode(in, static_cast<float>(round_trip[i])))
                << what << ": merged element " << i << " is not the head value rounded once";
          }
        }
      }
    }
  }
}

// merge_heads is split_heads' backward: for L(x) = <g, split_heads(x)>, in FP64 from the FP32
// forward, (L(x + h e_i) - L(x - h e_i)) / 2h is merge_heads(g)[i] for every element i; the
// forward only moves values, so with h a power of two the difference is exact.
TEST(AttentionPrimitives, MergeHeadsIsTheFiniteDifferenceOfSplitHeads) {
  CpuBackend be;
  std::mt19937_64 rng(2);
  constexpr int64_t P = 3, B = 2, H = 2, T = 3, D = 4;
  const Shape rows_shape{B, T, P * H * D};
  const Shape heads_shape{P, B, H, T, D};
  const Tensor g = make(heads_shape, DType::kF32, uniform(rng, heads_shape.numel(), -1.0, 1.0));
  Vec x = uniform(rng, rows_shape.numel(), -1.0, 1.0);
  for (double& v : x) v = std::round(v * 1024) / 1024;  // x +- 1/2 is then an FP32 value
  const auto loss = [&](int64_t i, double shift) {
    Vec shifted = x;
    shifted[i] += shift;
    Tensor heads = poisoned(heads_shape, DType::kF32);
    be.split_heads(make(rows_shape, DType::kF32, shifted), heads);
    const Vec v = values_of(heads), w = values_of(g);
    double sum = 0.0;
    for (size_t k = 0; k < v.size(); ++k) sum += v[k] * w[k];
    return sum;
  };
  Tensor dx = poisoned(rows_shape, DType::kF32);
  be.merge_heads(g, dx);
  const Vec analytic = values_of(dx);
  for (int64_t i = 0; i < rows_shape.numel(); ++i) {
    const double numeric = (loss(i, 0.5) - loss(i, -0.5)) / 1.0;
    EXPECT_NEAR(analytic[i], numeric, 1e-12) << "element " << i;
  }
}

// Same dtypes copy bit patterns: NaN payloads and signed zeros survive the permutation.
TEST(AttentionPrimitives, SplitHeadsCopiesBitPatterns) {
  CpuBackend be;
  const Shape rows_shape{1, 2, 3 * 2};
  Tensor rows = Tensor::empty(rows_shape, DType::kBF16);
  const uint16_t codes[] = {0x7FC1, 0xFFFF, 0x8000, 0x0001, 0x7F80, 0xFF80,
                            0x3F80, 0x7FA0, 0x0000, 0x8001, 0x4000, 0xC000};
  for (int64_t i = 0; i < rows.numel(); ++i) set_code(rows, i, codes[i]);
  Tensor heads = poisoned(Shape{3, 1, 1, 2, 2}, DType::kBF16);
  be.split_heads(rows, heads);
  Tensor back = poisoned(rows_shape, DType::kBF16);
  be.merge_heads(heads, back);
  EXPECT_TRUE(same_bytes(rows, back));
  EXPECT_EQ(code_at(heads, 0), 0x7FC1u);  // rows[0, 0, 0] = heads[0, 0, 0, 0, 0]
  EXPECT_EQ(code_at(heads, 2), 0x3F80u);  // rows[0, 1, 0] = heads[0, 0, 0, 1, 0]
}

// ---------------------------------------------------------------------------------------
// causal_softmax_forward and causal_softmax_backward

// P of each row (n, t) over its first t + 1 columns, zero beyond, in FP64.
Vec softmax_ref(const Vec& scores, int64_t T, double scale) {
  Vec p(scores.size(), 0.0);
  for (size_t r = 0; r < scores.size() / T; ++r) {
    const int64_t n = static_cast<int64_t>(r) % T + 1;
    const double* s = scores.data() + r * T;
    double m = -INFINITY;
    for (int64_t j = 0; j < n; ++j) m = std::max(m, scale * s[j]);
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += std::exp(scale * s[j] - m);
    for (int64_t j = 0; j < n; ++j) p[r * T + j] = std::exp(scale * s[j] - m) / sum;
  }
  return p;
}

// dS = scale P (dP - rowsum(P dP)) over the visible columns, zero beyond.
Vec softmax_backward_ref(const Vec& p, const Vec& dp, int64_t T, double scale) {
  Vec ds(p.size(), 0.0);
  for (size_t r = 0; r < p.size() / T; ++r) {
    const int64_t n = static_cast<int64_t>(r) % T + 1;
    double dot = 0.0;
    for (int64_t j = 0; j < n; ++j) dot += p[r * T + j] * dp[r * T + j];
    for (int64_t j = 0; j < n; ++j) ds[r * T + j] = scale * p[r * T + j] * (dp[r * T + j] - dot);
  }
  return ds;
}

// Scores with NaN above every diagonal: the ops must never read them.
Vec scores_with_nan_above(std::mt19937_64& rng, int64_t N, int64_t T, double magnitude) {
  Vec s = uniform(rng, N * T * T, -magnitude, magnitude);
  for (int64_t r = 0; r < N * T; ++r)
    for (int64_t j = r % T + 1; j < T; ++j) s[r * T + j] = NAN;
  return s;
}

Vec zero_above(Vec v, int64_t T) {
  for (size_t r = 0; r < v.size() / T; ++r)
    for (int64_t j = static_cast<int64_t>(r) % T + 1; j < T; ++j) v[r * T + j] = 0.0;
  return v;
}

double tolerance(DType dtype) {
  return dtype == DType::kF32 ? 1e-6 : dtype == DType::kBF16 ? 8e-3 : 1e-3;
}

TEST(AttentionPrimitives, CausalSoftmaxForwardMatchesFp64) {
  CpuBackend be;
  std::mt19937_64 rng(2);
  const float scale = 0.3f;
  for (const Shape& shape : {Shape{2, 3, 7, 7}, Shape{1, 1, 1}, Shape{5, 16, 16}, Shape{33, 33}}) {
    const int64_t T = shape[-1], N = shape.numel() / (T * T);
    for (DType in : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (DType out : {DType::kF32, DType::kBF16}) {
        const std::string what =
            std::string(dtype_name(in)) + " -> " + dtype_name(out) + " " + shape.str();
        // Scores of several units, so that the softmax is far from uniform.
        const Tensor scores = make(shape, in, scores_with_nan_above(rng, N, T, 8.0));
        Tensor probs = poisoned(shape, out);
        be.causal_softmax_forward(scores, scale, probs);
        const Vec ref = softmax_ref(values_of(scores), T, scale);
        expect_close(values_of(probs), ref, tolerance(out), what);
        if (in == out) {  // in place, the same results
          Tensor inplace = make(shape, in, values_of(scores));
          be.causal_softmax_forward(inplace, scale, inplace);
          EXPECT_TRUE(same_bytes(inplace, probs)) << what << " in place";
        }
      }
    }
  }
}

// GPT-2's context: rows of up to 1,024 visible scores of similar size. Every probability
// stays within 5e-7 relative of FP64 (the shift by the maximum, exp, the sum and the
// normalisation each round once; the scale is a power of two): measured 2.1e-7, where a
// running FP32 sum over each row gave 1.6e-6.
TEST(AttentionPrimitives, CausalSoftmaxLongRowsStayNearFp64) {
  CpuBackend be;
  std::mt19937_64 rng(4);
  const int64_t T = 1024;
  const float scale = 0.125f;
  const Tensor scores = make(Shape{1, T, T}, DType::kF32, scores_with_nan_above(rng, 1, T, 4.0));
  Tensor probs = poisoned(Shape{1, T, T}, DType::kF32);
  be.causal_softmax_forward(scores, scale, probs);
  const Vec ref = softmax_ref(values_of(scores), T, scale);
  const Vec got = values_of(probs);
  double worst = 0.0;
  for (int64_t r = 0; r < T; ++r) {
    for (int64_t j = 0; j <= r; ++j) {
      worst = worse_error(worst, std::fabs(got[r * T + j] - ref[r * T + j]) / ref[r * T + j]);
    }
  }
  EXPECT_LT(worst, 5e-7) << "largest relative error of a probability";
}

TEST(AttentionPrimitives, CausalSoftmaxBackwardMatchesFp64AndFiniteDifferences) {
  CpuBackend be;
  std::mt19937_64 rng(3);
  const double scale = 0.4;
  // d/dS of sum(w * softmax(scale S)) by central differences of the FP64 forward is the
  // reference backward applied to w: checks the formula itself.
  {
    const int64_t T = 6;
    const Vec s = uniform(rng, 2 * T * T, -3.0, 3.0);
    const Vec w = zero_above(uniform(rng, 2 * T * T), T);
    const Vec fd =
        finite_difference([&](const Vec& x) { return dot(softmax_ref(x, T, scale), w); }, s);
    expect_close(softmax_backward_ref(softmax_ref(s, T, scale), w, T, scale), fd, 1e-7,
                 "reference softmax backward vs finite differences");
  }
  for (const Shape& shape : {Shape{2, 3, 7, 7}, Shape{1, 1, 1}, Shape{4, 24, 24}}) {
    const int64_t T = shape[-1], N = shape.numel() / (T * T);
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string what = std::string(dtype_name(dtype)) + " " + shape.str();
      Tensor probs = poisoned(shape, dtype);
      be.causal_softmax_forward(make(shape, DType::kF32, scores_with_nan_above(rng, N, T, 3.0)),
                                static_cast<float>(scale), probs);
      const Tensor dprobs = make(shape, dtype, scores_with_nan_above(rng, N, T, 1.0));
      Tensor dscores = poisoned(shape, dtype);
      be.causal_softmax_backward(probs, dprobs, static_cast<float>(scale), dscores);
      const Vec ref = softmax_backward_ref(values_of(probs), values_of(dprobs), T, scale);
      // dS = P (dP - rowsum) cancels: judged on the scale of the whole tensor.
      expect_close(values_of(dscores), ref, dtype == DType::kF32 ? 1e-6 : 2e-2, what);
      Tensor inplace = make(shape, dtype, values_of(dprobs));
      be.causal_softmax_backward(probs, inplace, static_cast<float>(scale), inplace);
      EXPECT_TRUE(same_bytes(inplace, dscores)) << what << " in place";
    }
  }
}

// The online form (the CUDA kernel's) gives the two-pass maximum and sum, however a row is
// split into chunks and merged, and treats special values as the two-pass form does.
TEST(AttentionPrimitives, OnlineSoftmaxMatchesTwoPasses) {
  std::mt19937_64 rng(4);
  auto two_pass = [](const std::vector<float>& z) {
    float m = -INFINITY;
    for (float x : z) m = softmax_max(m, x);
    float sum = 0.0f;
    for (float x : z) sum += softmax_exp(x, m);
    return SoftmaxState{m, sum};
  };
  // Lane-strided chunks merged in a tree, as the kernel does.
  auto online = [](const std::vector<float>& z, size_t chunk, size_t lanes) {
    std::vector<SoftmaxState> lane(lanes, SoftmaxState{-INFINITY, 0.0f});
    for (size_t c = 0; c * chunk < z.size(); ++c) {
      SoftmaxState piece{-INFINITY, 0.0f};
      for (size_t k = c * chunk; k < std::min(z.size(), (c + 1) * chunk); ++k) {
        piece = softmax_merge(piece, {z[k], 1.0f});  // one term z is {z, 1}
      }
      lane[c % lanes] = softmax_merge(lane[c % lanes], piece);
    }
    for (size_t width = lanes / 2; width > 0; width /= 2) {
      for (size_t i = 0; i < width; ++i) lane[i] = softmax_merge(lane[i], lane[i + width]);
    }
    return lane[0];
  };
  std::uniform_real_distribution<float> dist(-30.0f, 30.0f);
  for (size_t n : {1, 7, 100, 1000}) {
    std::vector<float> z(n);
    for (float& x : z) x = dist(rng);
    const SoftmaxState want = two_pass(z);
    for (size_t chunk : {1, 8}) {
      const SoftmaxState got = online(z, chunk, 32);
      EXPECT_EQ(got.max, want.max) << "n " << n;
      EXPECT_NEAR(got.sum, want.sum, 1e-5 * want.sum) << "n " << n << " chunk " << chunk;
    }
  }
  const float inf = INFINITY;
  const std::vector<std::vector<float>> specials = {
      {-inf, 2.0f, -inf}, {-inf, -inf}, {1.0f, NAN, 3.0f}, {1.0f, inf}, {inf, inf}, {-inf}};
  for (const std::vector<float>& z : specials) {
    const SoftmaxState want = two_pass(z);
    for (size_t chunk : {1, 2}) {
      const SoftmaxState got = online(z, chunk, 2);
      EXPECT_EQ(got.max, want.max);
      // Where two passes give a NaN probability (exp(z - max) or the sum), so does the
      // online state: a NaN sum, or a max with which exp(z - max) is NaN.
      const bool want_nan = std::isnan(want.sum) || std::isnan(softmax_exp(want.max, want.max));
      const bool got_nan = std::isnan(got.sum) || std::isnan(softmax_exp(got.max, got.max));
      EXPECT_EQ(got_nan, want_nan);
      if (!want_nan) {
        EXPECT_FLOAT_EQ(got.sum, want.sum);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// The composed routine

struct Results {
  Tensor out, att, dqkv;
};

Results run_composed(Backend& be, const Tensor& qkv, const Tensor& dout, const AttnShape& s,
                     DType att_dtype, DType out_dtype) {
  Results r{poisoned(s.out(), out_dtype), poisoned(s.att(), att_dtype),
            poisoned(s.qkv(), out_dtype)};
  composed_attention_forward(be, qkv, r.out, r.att, static_cast<int>(s.H));
  composed_attention_backward(be, dout, qkv, r.att, r.dqkv, static_cast<int>(s.H));
  return r;
}

TEST(ComposedAttention, MatchesFp64) {
  CpuBackend be;
  std::mt19937_64 rng(5);
  for (const AttnShape& s : kAttentionShapes) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string what = describe(s, dtype);
      const Tensor qkv = make(s.qkv(), dtype, uniform(rng, s.qkv().numel(), -2.0, 2.0));
      const Tensor dout = make(s.out(), dtype, uniform(rng, s.out().numel()));
      const Results got = run_composed(be, qkv, dout, s, dtype, dtype);
      const AttentionRef ref = attention_ref(values_of(qkv), s);
      // F32: FP32 rounding only. BF16 and F16: the scores, the saved probabilities and the
      // score gradients are stored in the dtype (attention.h); a score S rounded by 2^-9 |S|
      // moves its probability by that times the scaled score (up to about 5 here), so a few
      // units of the dtype's spacing.
      const double rtol = dtype == DType::kF32 ? 1e-5 : dtype == DType::kBF16 ? 2.5e-2 : 4e-3;
      expect_close(values_of(got.att), ref.att, rtol, what + " att");
      expect_close(values_of(got.out), ref.out, rtol, what + " out");
      const Vec dref = attention_backward_ref(values_of(dout), values_of(qkv), s);
      expect_close(values_of(got.dqkv), dref, dtype == DType::kBF16 ? 3e-2 : 2 * rtol,
                   what + " dqkv");
    }
  }
}

TEST(ComposedAttention, BackwardMatchesFiniteDifferences) {
  CpuBackend be;
  std::mt19937_64 rng(6);
  for (const AttnShape& s : {AttnShape{2, 5, 8, 2}, AttnShape{1, 7, 9, 3}}) {
    const Tensor qkv = make(s.qkv(), DType::kF32, uniform(rng, s.qkv().numel(), -2.0, 2.0));
    const Vec w = uniform(rng, s.out().numel());
    const Vec fd = finite_difference([&](const Vec& v) { return dot(attention_ref(v, s).out, w); },
                                     values_of(qkv));
    const Results got =
        run_composed(be, qkv, make(s.out(), DType::kF32, w), s, DType::kF32, DType::kF32);
    expect_close(values_of(got.dqkv), fd, 1e-5, describe(s, DType::kF32) + " dqkv");
  }
}

// qkv, att, out and dout of different activation dtypes: each product runs on the wider
// dtype, so the results are those of the widest computation, rounded where stored.
TEST(ComposedAttention, MixedDtypesMatchFp64) {
  CpuBackend be;
  std::mt19937_64 rng(7);
  const AttnShape s{2, 13, 24, 2};
  struct Case {
    DType qkv, att, out;
  };
  for (const Case& c :
       {Case{DType::kF32, DType::kBF16, DType::kF32}, Case{DType::kBF16, DType::kF32, DType::kF32},
        Case{DType::kBF16, DType::kF16, DType::kBF16},
        Case{DType::kF16, DType::kF32, DType::kBF16}}) {
    const std::string what = std::string("qkv ") + dtype_name(c.qkv) + " att " + dtype_name(c.att) +
                             " out " + dtype_name(c.out);
    const Tensor qkv = make(s.qkv(), c.qkv, uniform(rng, s.qkv().numel(), -2.0, 2.0));
    const Tensor dout = make(s.out(), c.out, uniform(rng, s.out().numel()));
    const Results got = run_composed(be, qkv, dout, s, c.att, c.out);
    const AttentionRef ref = attention_ref(values_of(qkv), s);
    const double rtol = c.att == DType::kF32 && c.out == DType::kF32 ? 1e-5 : 1.5e-2;
    expect_close(values_of(got.att), ref.att, tolerance(c.att) * 2, what + " att");
    expect_close(values_of(got.out), ref.out, rtol, what + " out");
    expect_close(values_of(got.dqkv), attention_backward_ref(values_of(dout), values_of(qkv), s),
                 3e-2, what + " dqkv");
  }
}

// The CPU backend's fused op rounds where the routine stores (attention.h), so the two
// compute the same function: F32 results agree to FP32 rounding of differently ordered sums,
// and in BF16 almost every stored value is the same bit pattern (a different FP32 sum order
// only rarely lands on the other side of a rounding boundary).
TEST(ComposedAttention, MatchesTheFusedCpuOp) {
  CpuBackend be;
  std::mt19937_64 rng(8);
  for (const AttnShape& s : kAttentionShapes) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string what = describe(s, dtype);
      const Tensor qkv = make(s.qkv(), dtype, uniform(rng, s.qkv().numel(), -2.0, 2.0));
      const Tensor dout = make(s.out(), dtype, uniform(rng, s.out().numel()));
      const Results composed = run_composed(be, qkv, dout, s, dtype, dtype);
      Results fused{poisoned(s.out(), dtype), poisoned(s.att(), dtype), poisoned(s.qkv(), dtype)};
      be.attention_forward(qkv, fused.out, fused.att, static_cast<int>(s.H));
      be.attention_backward(dout, qkv, fused.att, fused.dqkv, static_cast<int>(s.H));
      const std::pair<const char*, std::pair<const Tensor*, const Tensor*>> results[] = {
          {"att", {&composed.att, &fused.att}},
          {"out", {&composed.out, &fused.out}},
          {"dqkv", {&composed.dqkv, &fused.dqkv}}};
      for (const auto& [name, pair] : results) {
        const Tensor& a = *pair.first;
        const Tensor& b = *pair.second;
        expect_close(values_of(a), values_of(b), dtype == DType::kF32 ? 1e-5 : tolerance(dtype),
                     what + " " + name);
        if (dtype == DType::kF32) continue;
        int64_t same = 0;
        for (int64_t i = 0; i < a.numel(); ++i) same += code_at(a, i) == code_at(b, i);
        EXPECT_GE(static_cast<double>(same), 0.97 * static_cast<double>(a.numel()))
            << what << " " << name << ": bit-identical elements";
      }
    }
  }
}

// A NaN key at position 3 of head 0 reaches that head's outputs from position 3 on and
// nothing else; a NaN value likewise, except that the product P V also multiplies it by the
// zeros above the diagonal (0 * NaN = NaN), so it reaches the head's earlier rows too
// (attention.h). Other heads and batches stay finite.
TEST(ComposedAttention, NanStaysInItsHead) {
  CpuBackend be;
  std::mt19937_64 rng(9);
  const AttnShape s{2, 6, 8, 2};
  for (int which : {1, 2}) {
    Vec qkv = uniform(rng, s.qkv().numel());
    qkv[s.qkv_index(0, 3, which, 0, 1)] = NAN;
    Tensor out = poisoned(s.out(), DType::kF32), att = poisoned(s.att(), DType::kF32);
    composed_attention_forward(be, make(s.qkv(), DType::kF32, qkv), out, att,
                               static_cast<int>(s.H));
    const Vec o = values_of(out);
    for (int64_t b = 0; b < s.B; ++b) {
      for (int64_t t = 0; t < s.T; ++t) {
        for (int64_t c = 0; c < s.C; ++c) {
          const bool in_head = b == 0 && c < s.D() && (which == 1 || c == 1);
          const bool nan = std::isnan(o[(b * s.T + t) * s.C + c]);
          const std::string where = std::string(which == 1 ? "key" : "value") + ": b " +
                                    std::to_string(b) + " t " + std::to_string(t) + " channel " +
                                    std::to_string(c);
          if (!in_head) {
            EXPECT_FALSE(nan) << where;
          } else if (t >= 3 || which == 2) {
            EXPECT_TRUE(nan) << where;
          } else {
            EXPECT_FALSE(nan) << where;  // a key's NaN score above the diagonal is masked
          }
        }
      }
    }
  }
}

TEST(ComposedAttention, ResultsDoNotDependOnTheThreadCount) {
  CpuBackend be;
  std::mt19937_64 rng(10);
  const AttnShape s{2, 33, 64, 4};
  const Tensor qkv = make(s.qkv(), DType::kBF16, uniform(rng, s.qkv().numel()));
  const Tensor dout = make(s.out(), DType::kBF16, uniform(rng, s.out().numel()));
  Results one, three;
  with_threads(1, [&] { one = run_composed(be, qkv, dout, s, DType::kBF16, DType::kBF16); });
  with_threads(3, [&] { three = run_composed(be, qkv, dout, s, DType::kBF16, DType::kBF16); });
  EXPECT_TRUE(same_bytes(one.out, three.out));
  EXPECT_TRUE(same_bytes(one.att, three.att));
  EXPECT_TRUE(same_bytes(one.dqkv, three.dqkv));
}

TEST(AttentionPrimitives, BadArgumentsThrowNamingTheOp) {
  CpuBackend be;
  Tensor rows = poisoned({2, 3, 12}, DType::kF32);
  Tensor heads = poisoned({3, 2, 2, 3, 2}, DType::kF32);
  be.split_heads(rows, heads);  // [2, 3, 3*2*2]: fine
  Tensor wrong = poisoned({3, 2, 2, 3, 3}, DType::kF32);
  expect_error([&] { be.split_heads(rows, wrong); }, {"split_heads", "x", "[2, 3, 18]"});
  Tensor flat = poisoned({36}, DType::kF32);
  expect_error([&] { be.merge_heads(flat, rows); }, {"merge_heads", "x", "5 dimensions"});
  Tensor ints = Tensor::empty({3, 2, 2, 3, 2}, DType::kI32);
  expect_error([&] { be.merge_heads(ints, rows); }, {"merge_heads", "x", "dtype"});
  Tensor same_memory = rows.view(0, Shape{3, 2, 2, 3, 1});
  Tensor rows_half = rows.view(0, Shape{2, 3, 6});
  expect_error([&] { be.split_heads(rows_half, same_memory); }, {"split_heads", "overlaps"});

  Tensor scores = poisoned({2, 4, 4}, DType::kF32);
  Tensor probs = poisoned({2, 4, 4}, DType::kF32);
  Tensor not_square = poisoned({2, 4, 5}, DType::kF32);
  expect_error([&] { be.causal_softmax_forward(not_square, 1.0f, not_square); },
               {"causal_softmax_forward", "scores", "square"});
  expect_error([&] { be.causal_softmax_forward(scores, NAN, probs); },
               {"causal_softmax_forward", "scale"});
  Tensor other_shape = poisoned({1, 4, 4}, DType::kF32);
  expect_error([&] { be.causal_softmax_forward(scores, 1.0f, other_shape); },
               {"causal_softmax_forward", "probs"});
  Tensor shifted = scores.view(1, Shape{1, 4, 4});
  Tensor first = scores.view(0, Shape{1, 4, 4});
  expect_error([&] { be.causal_softmax_forward(first, 1.0f, shifted); },
               {"causal_softmax_forward", "partly"});
  expect_error([&] { be.causal_softmax_backward(probs, scores, 1.0f, probs); },
               {"causal_softmax_backward", "dscores", "overlaps", "probs"});
  expect_error([&] { be.causal_softmax_backward(probs, scores, 1.0f, other_shape); },
               {"causal_softmax_backward", "dscores"});
}

}  // namespace
}  // namespace mantissa::core
