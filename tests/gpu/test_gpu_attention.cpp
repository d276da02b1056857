// Causal attention on the CUDA backend against the CPU backend: each primitive of the
// composed routine (core/ops/attention.h) and the whole routine, which is what the CUDA
// backend's attention_forward and attention_backward run.
//  - split_heads and merge_heads: bit for bit (the same conversions of dtype.h), on the
//    16-byte path (D a multiple of 8, aligned) and the scalar one (odd D, a misaligned view);
//  - causal_softmax_forward and causal_softmax_backward: within the dtype's tolerance
//    (gpu_compare.h; the GPU's online maximum and sum and its lane-split sums round
//    differently), on both paths, in place, with NaN above the diagonal that neither may
//    read, and zeros written exactly above it; the forward against an FP64 reference (see
//    causal_softmax_fp64), the backward against the CPU;
//  - the whole routine against the CPU backend's attention op (its fused kernel rounds where
//    the routine does) and against the routine run on the CPU backend, F32, BF16, F16 and
//    mixed dtypes, odd T and D, several batches and heads, and GPT-2 124M's head shape.
// Outputs are poisoned with NaN first on both backends.
//
// Built in every build; without a CUDA device every test reports "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "core/ops/attention.h"
#include "core/ops/backend.h"
#include "tests/common/test_util.h"
#include "tests/gpu/gpu_compare.h"

namespace mantissa::core {
namespace {

using namespace gpu_test;

// ---------------------------------------------------------------------------------------
// Head permutations

struct HeadsCase {
  int64_t P, B, H, T, D;
};

TEST(GpuAttention, SplitAndMergeHeadsMatchCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(1);
  // Odd D (scalar path), D = 64 and 8 (16-byte path), one element per head.
  for (const HeadsCase& c : {HeadsCase{3, 2, 3, 5, 7}, HeadsCase{3, 2, 12, 33, 64},
                             HeadsCase{1, 2, 2, 9, 8}, HeadsCase{3, 1, 1, 1, 1}}) {
    const Shape rows_shape{c.B, c.T, c.P * c.H * c.D};
    const Shape heads_shape{c.P, c.B, c.H, c.T, c.D};
    for (DType in : {DType::kF32, DType::kBF16, DType::kF16}) {
      const Tensor rows = random_tensor(rows_shape, in, rng, {1e-3f, 1.0f, 300.0f});
      for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
        const std::string what =
            std::string(dtype_name(in)) + " -> " + dtype_name(out) + " " + heads_shape.str();
        auto [heads, heads_dev] = b.poisoned(heads_shape, out);
        b.cpu->split_heads(rows, heads);
        b.gpu->split_heads(b.to_device(rows), heads_dev);
        expect_same_bits(heads, b.to_host(heads_dev), "split_heads " + what);
        auto [back, back_dev] = b.poisoned(rows_shape, in);
        b.cpu->merge_heads(heads, back);
        b.gpu->merge_heads(b.to_device(heads), back_dev);
        expect_same_bits(back, b.to_host(back_dev), "merge_heads " + what);
      }
    }
  }
}

// Views that start one element into their buffer cannot take 16-byte accesses.
TEST(GpuAttention, SplitHeadsOfMisalignedViewsMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(2);
  const Shape rows_shape{2, 9, 3 * 2 * 8};
  const Shape heads_shape{3, 2, 2, 9, 8};
  const Tensor buffer = random_tensor(Shape{rows_shape.numel() + 1}, DType::kBF16, rng);
  const Tensor rows = buffer.view(1, rows_shape);
  auto [heads_buffer, heads_buffer_dev] = b.poisoned(Shape{heads_shape.numel() + 1}, DType::kBF16);
  Tensor heads = heads_buffer.view(1, heads_shape);
  Tensor heads_dev = heads_buffer_dev.view(1, heads_shape);
  b.cpu->split_heads(rows, heads);
  b.gpu->split_heads(b.to_device(buffer).view(1, rows_shape), heads_dev);
  expect_same_bits(heads_buffer, b.to_host(heads_buffer_dev), "split_heads misaligned");
}

// ---------------------------------------------------------------------------------------
// Causal softmax

// Random scores with NaN above every diagonal: neither backend may read them.
Tensor scores_with_nan_above(const Shape& shape, DType dtype, std::mt19937_64& rng,
                             std::vector<float> magnitudes) {
  Tensor t = random_tensor(shape, dtype, rng, std::move(magnitudes));
  const int64_t T = shape[-1];
  for (int64_t r = 0; r < t.numel() / T; ++r) {
    for (int64_t j = r % T + 1; j < T; ++j) set_code(t, r * T + j, encode(dtype, NAN));
  }
  return t;
}

void expect_zero_above_diagonal(const Tensor& t, const std::string& what) {
  const int64_t T = t.shape()[-1];
  int64_t bad = 0;
  for (int64_t r = 0; r < t.numel() / T; ++r) {
    for (int64_t j = r % T + 1; j < T; ++j) bad += code_at(t, r * T + j) != 0;
  }
  EXPECT_EQ(bad, 0) << what << ": elements above the diagonal that are not +0";
}

// causal_softmax_forward in FP64 from the stored scores (each times `scale` in FP32, as both
// backends take them): probabilities rounded once to probs' dtype, +0 above the diagonal. The
// GPU's forward is held to this: every probability of a row inherits the error of its sum, and
// the reference is the one that has none. (A running FP32 sum, which the CPU backend used until
// it summed in FP64, was off by up to 1.3e-5 on the ~1000-column rows below; an emulation of
// the kernel, its lane order and an exp off by up to 2 ulp, stays within 3e-6.)
void causal_softmax_fp64(const Tensor& scores, float scale, Tensor& probs) {
  const int64_t T = scores.shape()[-1];
  std::vector<double> z(static_cast<size_t>(T));
  for (int64_t r = 0; r < scores.numel() / T; ++r) {
    const int64_t n = r % T + 1;
    double max_z = -INFINITY;
    for (int64_t j = 0; j < n; ++j) {
      z[j] = static_cast<float>(value_at(scores, r * T + j)) * scale;
      max_z = std::max(max_z, z[j]);
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; ++j) sum += std::exp(z[j] - max_z);
    for (int64_t j = 0; j < T; ++j) {
      const float p = j < n ? static_cast<float>(std::exp(z[j] - max_z) / sum) : 0.0f;
      set_code(probs, r * T + j, encode(probs.dtype(), p));
    }
  }
}

// T = 8 and 1024: 16-byte path; 1, 7, 77, 1030: scalar path (rows not whole 16-byte
// chunks). 1024 rows of GPT-2 124M's length, 1030 beyond it.
const Shape kScoreShapes[] = {Shape{3, 8, 8},    Shape{2, 1024, 1024}, Shape{1, 1, 1},
                              Shape{2, 3, 7, 7}, Shape{2, 77, 77},     Shape{1, 1030, 1030}};

TEST(GpuAttention, CausalSoftmaxForwardMatchesFp64Reference) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(3);
  const float scale = 0.125f;
  for (const Shape& shape : kScoreShapes) {
    for (DType in : {DType::kF32, DType::kBF16, DType::kF16}) {
      // Scaled scores of a few units and some of tens: far from uniform, and rows where the
      // maximum moves late.
      const Tensor scores = scores_with_nan_above(shape, in, rng, {4.0f, 40.0f});
      const Tensor scores_dev = b.to_device(scores);
      for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
        const std::string what = "causal_softmax_forward " + std::string(dtype_name(in)) + " -> " +
                                 dtype_name(out) + " " + shape.str();
        Tensor probs = Tensor::empty(shape, out);
        causal_softmax_fp64(scores, scale, probs);
        Tensor probs_dev = b.poisoned(shape, out).second;
        b.gpu->causal_softmax_forward(scores_dev, scale, probs_dev);
        const Tensor got = b.to_host(probs_dev);
        expect_close(probs, got, what);
        expect_zero_above_diagonal(got, what);
      }
      // In place: the same results as out of place.
      auto [probs, probs_dev] = b.poisoned(shape, in);
      b.gpu->causal_softmax_forward(scores_dev, scale, probs_dev);
      Tensor inplace_dev = b.to_device(scores);
      b.gpu->causal_softmax_forward(inplace_dev, scale, inplace_dev);
      expect_same_bits(b.to_host(probs_dev), b.to_host(inplace_dev),
                       "causal_softmax_forward in place " + shape.str());
    }
  }
}

TEST(GpuAttention, CausalSoftmaxBackwardMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(4);
  const float scale = 0.125f;
  for (const Shape& shape : kScoreShapes) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string what =
          "causal_softmax_backward " + std::string(dtype_name(dtype)) + " " + shape.str();
      // Probabilities from the CPU's forward, NaN planted above the diagonal again.
      Tensor probs = Tensor::empty(shape, dtype);
      b.cpu->causal_softmax_forward(scores_with_nan_above(shape, DType::kF32, rng, {4.0f}), scale,
                                    probs);
      const int64_t T = shape[-1];
      for (int64_t r = 0; r < probs.numel() / T; ++r) {
        for (int64_t j = r % T + 1; j < T; ++j) set_code(probs, r * T + j, encode(dtype, NAN));
      }
      const Tensor dprobs = scores_with_nan_above(shape, dtype, rng, {1.0f});
      const Tensor probs_dev = b.to_device(probs), dprobs_dev = b.to_device(dprobs);
      auto [dscores, dscores_dev] = b.poisoned(shape, dtype);
      b.cpu->causal_softmax_backward(probs, dprobs, scale, dscores);
      b.gpu->causal_softmax_backward(probs_dev, dprobs_dev, scale, dscores_dev);
      const Tensor got = b.to_host(dscores_dev);
      expect_close(dscores, got, what);
      expect_zero_above_diagonal(got, what);
      Tensor inplace_dev = b.to_device(dprobs);
      b.gpu->causal_softmax_backward(probs_dev, inplace_dev, scale, inplace_dev);
      expect_same_bits(got, b.to_host(inplace_dev), what + " in place");
    }
  }
}

// ---------------------------------------------------------------------------------------
// The whole routine

// GPU against CPU for results downstream of rounded intermediates (BF16 or F16 scores,
// probabilities or score gradients). The backends sum in different orders, so now and then
// an intermediate rounds to its neighbour on one of them (one unit: 2^-8 relative in BF16,
// 2^-11 in F16), and what depends on it moves by about that times the scaled score (a few
// units). So the tolerance is the loosest of the result's and the intermediates' dtypes
// (gpu_compare.h), every element within 4x of it, and 99% within 1x. A result of FP32
// intermediates only has the result dtype's own tolerance.
void expect_close_through_rounding(const Tensor& expected, const Tensor& actual,
                                   std::initializer_list<DType> intermediates,
                                   const std::string& what) {
  double tol = tolerance(actual.dtype());
  bool rounded = false;
  for (DType d : intermediates) {
    rounded = rounded || d != DType::kF32;
    tol = std::max(tol, tolerance(d));
  }
  if (!rounded) {
    expect_close(expected, actual, tol, what);
    return;
  }
  expect_close(expected, actual, 4 * tol, what);
  double squares = 0.0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    squares += value_at(expected, i) * value_at(expected, i);
  }
  const double rms =
      std::sqrt(squares / static_cast<double>(std::max<int64_t>(1, expected.numel())));
  int64_t outside = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double e = value_at(expected, i), a = value_at(actual, i);
    outside += !(std::fabs(a - e) <= tol * std::max(std::fabs(e), rms));
  }
  EXPECT_LE(static_cast<double>(outside), 0.01 * static_cast<double>(expected.numel()))
      << what << ": elements beyond " << tol << " relative, of " << expected.numel();
}

Tensor poisoned_host(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  poison(t);
  return t;
}

struct AttentionCase {
  int64_t B, T, C;
  int n_head;
  DType dtype;
  DType att = DType::kF32;  // the saved probabilities: F32, or rounded to BF16 or F16
};

TEST(GpuAttention, AttentionMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(8);
  const AttentionCase cases[] = {
      {1, 1, 4, 1, DType::kF32},
      {2, 7, 12, 3, DType::kF32},
      {2, 64, 128, 2, DType::kF32},
      {1, 70, 96, 2, DType::kBF16},
      {2, 33, 768, 12, DType::kBF16},
      {1, 40, 80, 1, DType::kF16},
      {2, 65, 192, 3, DType::kF16, DType::kF16},
      {1, 70, 96, 2, DType::kBF16, DType::kBF16},
      {2, 37, 45, 3, DType::kBF16, DType::kBF16},  // D = 15
      {2, 17, 64, 2, DType::kF32, DType::kBF16},
      {1, 45, 48, 4, DType::kBF16, DType::kF16},
      {1, 1024, 768, 12, DType::kBF16, DType::kBF16},  // GPT-2 124M's heads and length
  };
  for (const AttentionCase& c : cases) {
    const std::string what = "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) +
                             " C=" + std::to_string(c.C) + " H=" + std::to_string(c.n_head) + " " +
                             dtype_name(c.dtype) + " att " + dtype_name(c.att);
    const Shape qkv_shape{c.B, c.T, 3 * c.C};
    const Shape out_shape{c.B, c.T, c.C};
    const Shape att_shape{c.B, c.n_head, c.T, c.T};
    const Tensor qkv = random_tensor(qkv_shape, c.dtype, rng, {0.5f, 2.0f});
    const Tensor qkv_dev = b.to_device(qkv);
    const Tensor dout = random_tensor(out_shape, c.dtype, rng);
    const Tensor dout_dev = b.to_device(dout);
    // The dtypes of the intermediates (core/ops/attention.h): S, then P (att), then dP and dS.
    const DType scores = attention_score_dtype(c.dtype, c.att);
    const DType grads = attention_score_grad_dtype(c.dtype, c.dtype);

    Tensor out_dev = b.poisoned(out_shape, c.dtype).second;
    Tensor att_dev = b.poisoned(att_shape, c.att).second;
    Tensor dqkv_dev = b.poisoned(qkv_shape, c.dtype).second;
    b.gpu->attention_forward(qkv_dev, out_dev, att_dev, c.n_head);
    b.gpu->attention_backward(dout_dev, qkv_dev, att_dev, dqkv_dev, c.n_head);
    const Tensor out_gpu = b.to_host(out_dev), att_gpu = b.to_host(att_dev);
    const Tensor dqkv_gpu = b.to_host(dqkv_dev);

    // Against the CPU backend's op (its fused kernel) and the routine on the CPU backend.
    for (const bool composed : {false, true}) {
      const std::string which = (composed ? "composed on the CPU, " : "CPU op, ") + what;
      Tensor out = poisoned_host(out_shape, c.dtype), att = poisoned_host(att_shape, c.att);
      Tensor dqkv = poisoned_host(qkv_shape, c.dtype);
      if (composed) {
        composed_attention_forward(*b.cpu, qkv, out, att, c.n_head);
        composed_attention_backward(*b.cpu, dout, qkv, att, dqkv, c.n_head);
      } else {
        b.cpu->attention_forward(qkv, out, att, c.n_head);
        b.cpu->attention_backward(dout, qkv, att, dqkv, c.n_head);
      }
      expect_close_through_rounding(att, att_gpu, {scores}, "att " + which);
      expect_close_through_rounding(out, out_gpu, {scores, c.att}, "out " + which);
      expect_close_through_rounding(dqkv, dqkv_gpu, {scores, c.att, grads}, "dqkv " + which);
    }
  }
}

}  // namespace
}  // namespace mantissa::core
