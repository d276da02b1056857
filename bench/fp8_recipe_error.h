// How accurate each FP8 recipe's GEMM is: the relative error of an FP8 product against the
// FP64 product of the same unquantized operands, at the GEMM shapes of the reference model.
// Shared by bench/bench_fp8_recipes.cpp (which prints the table) and
// tests/core/test_fp8_recipe_error.cpp (which holds its bounds), so the two measure the same
// thing.
//
// The GEMMs are a Linear layer's three, as models/nn/linear.h runs them with the block
// recipes: both operands K-major (A [M, K], B [N, K]), each quantized from FP32 in its role's
// scale mode (core::fp8_scale_mode), E4M3 throughout, so that the recipes differ only in how
// finely they scale. The per-tensor anchor (CURRENT) scales each operand by 448 / its own
// amax, as Fp8Operands does.
//
// Data: activations N(0, 1), weights N(0, 0.02), output gradients N(0, 1e-3); with
// kOutlier, channel 7 of every activation and gradient operand (a column of x or dy, a row of
// their transposes in the weight gradient) is 1000x larger.
#pragma once

#include <cblas.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/ops/fp8_operand.h"
#include "core/precision/fp8_scaling.h"

namespace mantissa::bench {

enum class RecipeData { kGaussian, kOutlier };

// One GEMM of the reference model: C[m, n] = A[m, K] B[n, K]^T.
struct RecipeGemm {
  std::string layer;  // "qkv", "attn.proj", "fc", "fc.proj"
  std::string pass;   // "forward", "dgrad", "wgrad"
  int64_t m = 0, n = 0, k = 0;
  core::Fp8Role a_role = core::Fp8Role::kInput, b_role = core::Fp8Role::kWeight;
  // Where an operand's channels run: along K (columns of x or dy), or along the rows (the
  // weight gradient's x^T and dy^T).
  bool a_channels_along_k = true, b_channels_along_k = true;
};

// GPT-2 with n_embd d and `tokens` tokens per micro-batch (the reference: d = 384, T = 256,
// B = 8): the qkv, attention projection, MLP fc and fc projection layers, each forward
// (x W^T, K = in), input gradient (dy W, K = out) and weight gradient (dy^T x, K = tokens).
inline std::vector<RecipeGemm> reference_gemms(int64_t tokens = 2048, int64_t d = 384) {
  using core::Fp8Role;
  struct Layer {
    const char* name;
    int64_t in, out;
  };
  const Layer layers[] = {
      {"qkv", d, 3 * d}, {"attn.proj", d, d}, {"fc", d, 4 * d}, {"fc.proj", 4 * d, d}};
  std::vector<RecipeGemm> gemms;
  for (const Layer& l : layers) {
    gemms.push_back(
        {l.name, "forward", tokens, l.out, l.in, Fp8Role::kInput, Fp8Role::kWeight, true, true});
    gemms.push_back(
        {l.name, "dgrad", tokens, l.in, l.out, Fp8Role::kGradient, Fp8Role::kWeight, true, true});
    gemms.push_back(
        {l.name, "wgrad", l.out, l.in, tokens, Fp8Role::kGradient, Fp8Role::kInput, false, false});
  }
  return gemms;
}

inline constexpr int64_t kOutlierChannel = 7;
inline constexpr float kOutlierFactor = 1000.0f;

// A [rows, k] F32 operand of `role`, channels along K or along the rows; an outlier channel
// is `factor` times larger.
inline core::Tensor recipe_operand(core::Fp8Role role, int64_t rows, int64_t k,
                                   bool channels_along_k, RecipeData data, uint32_t seed,
                                   float factor = kOutlierFactor) {
  const float sigma = role == core::Fp8Role::kWeight     ? 0.02f
                      : role == core::Fp8Role::kGradient ? 1e-3f
                                                         : 1.0f;
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  core::Tensor t = core::Tensor::empty(core::Shape{rows, k}, core::DType::kF32);
  float* v = t.data_as<float>();
  const bool outlier = data == RecipeData::kOutlier && role != core::Fp8Role::kWeight;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < k; ++c) {
      const int64_t channel = channels_along_k ? c : r;
      v[r * k + c] = normal(rng) * (outlier && channel == kOutlierChannel ? factor : 1.0f);
    }
  }
  return t;
}

struct RecipeOperands {
  core::Tensor a, b;
};

inline RecipeOperands recipe_operands(const RecipeGemm& g, RecipeData data, uint32_t seed,
                                      float factor = kOutlierFactor) {
  return {recipe_operand(g.a_role, g.m, g.k, g.a_channels_along_k, data, seed, factor),
          recipe_operand(g.b_role, g.n, g.k, g.b_channels_along_k, data, seed + 1, factor)};
}

// FP64 C = A B^T of the unquantized operands (OpenBLAS dgemm on the widened values).
inline std::vector<double> fp64_product(const RecipeOperands& ops) {
  const int64_t m = ops.a.dim(0), n = ops.b.dim(0), k = ops.a.dim(1);
  std::vector<double> a(ops.a.data_as<float>(), ops.a.data_as<float>() + m * k);
  std::vector<double> b(ops.b.data_as<float>(), ops.b.data_as<float>() + n * k);
  std::vector<double> c(static_cast<size_t>(m * n));
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0, a.data(), static_cast<int>(k), b.data(),
              static_cast<int>(k), 0.0, c.data(), static_cast<int>(n));
  return c;
}

// One operand quantized to E4M3 as `recipe` quantizes its role, in the form gemm() takes.
inline core::Fp8Operand quantize_for_recipe(core::Backend& be, core::Fp8Recipe recipe,
                                            core::Fp8Role role, const core::Tensor& x) {
  core::Fp8Operand q;
  q.mode = core::fp8_scale_mode(recipe, role);
  q.codes = core::Tensor::empty(x.shape(), core::DType::kE4M3);
  if (q.mode == core::ScaleMode::kTensor) {
    // CURRENT: this tensor's amax, scale = 448 / amax, the GEMM takes 1 / scale.
    core::Tensor amax = core::Tensor::empty(core::Shape{1}, core::DType::kF32);
    be.amax(x, amax);
    const float scale = core::fp8_scale_from_amax(amax.data_as<float>()[0], 1.0f, 448.0f, 0);
    core::Tensor quantize = core::Tensor::empty(core::Shape{1}, core::DType::kF32);
    quantize.data_as<float>()[0] = scale;
    core::CastParams p;
    p.scale = &quantize;
    be.cast(x, q.codes, p);
    q.scale = core::Tensor::empty(core::Shape{1}, core::DType::kF32);
    q.scale.data_as<float>()[0] = static_cast<float>(1.0 / scale);
    return q;
  }
  q.scale = core::Tensor::empty(core::Shape{core::scale_count(q.mode, x.dim(0), x.dim(1))},
                                core::scale_dtype(q.mode));
  core::BlockQuantizeParams p;
  p.mode = q.mode;
  p.power_of_two = q.mode == core::ScaleMode::kVec32Ue8m0;
  be.quantize_blocks(x, q.codes, q.scale, p);
  return q;
}

// The FP8 product with `recipe`'s scales, F32 output.
inline core::Tensor fp8_product(core::Backend& be, core::Fp8Recipe recipe, const RecipeGemm& g,
                                const RecipeOperands& ops) {
  const core::Fp8Operand a = quantize_for_recipe(be, recipe, g.a_role, ops.a);
  const core::Fp8Operand b = quantize_for_recipe(be, recipe, g.b_role, ops.b);
  core::Tensor c = core::Tensor::empty(core::Shape{g.m, g.n}, core::DType::kF32);
  core::gemm_k_major(be, a, b, c);
  return c;
}

// ||C - ref||_F / ||ref||_F over C's elements; with `skip_channel` >= 0 over the elements
// away from row and column skip_channel only (in the weight gradient, the outputs that no
// outlier value feeds).
inline double relative_error(const core::Tensor& c, const std::vector<double>& ref,
                             int64_t skip_channel = -1) {
  const int64_t n = c.dim(1);
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const int64_t row = static_cast<int64_t>(i) / n, col = static_cast<int64_t>(i) % n;
    if (skip_channel >= 0 && (row == skip_channel || col == skip_channel)) continue;
    const double d = static_cast<double>(c.data_as<float>()[i]) - ref[i];
    err += d * d;
    norm += ref[i] * ref[i];
  }
  return std::sqrt(err / norm);
}

}  // namespace mantissa::bench
