// The FP8 recipes side by side on the CPU backend (bench/fp8_recipe_error.h):
//  1. numerics: the relative error of each of the reference model's GEMMs against FP64, per
//     recipe, on Gaussian data and on data with one outlier channel 1000x larger; the anchor
//     is per-tensor CURRENT scaling, measured in the same run on the same operands;
//  2. speed: the block-scaled GEMMs next to the per-tensor FP8 GEMM at the reference shapes,
//     and block quantisation (with its scales) next to a memcpy of the same bytes, timed in
//     alternation and compared by medians, so that other load shifts both alike.
// Figures only: tests/core/test_fp8_recipe_error.cpp holds the numerics to their bounds, and
// says why a 1000x outlier channel cannot make any recipe 10x better than per-tensor scaling
// in E4M3 (its range still holds every other value); the outlier-size sweep shows where
// per-tensor scaling does break. On outlier data the weight gradients' rows count the outputs
// no outlier value feeds: the outlier's own row and column of dy^T x are sums of terms 10^6
// times the others' (one element holds over 90% of ||C||^2), so over all of C the error would
// be that of a few dot products, set by how their sums cancel rather than by the recipe.
//
// Usage: bench_fp8_recipes [tokens n_embd [repeats]]   (default 2048 384 7: GPT-2 d=384, T=256,
//        B=8)
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_timing.h"
#include "bench/fp8_recipe_error.h"
#include "core/ops/cpu_switches.h"

using namespace mantissa;
using core::Fp8Recipe;

namespace {

using mantissa::bench::median;
using mantissa::bench::seconds_of;

constexpr Fp8Recipe kRecipes[] = {Fp8Recipe::kCurrent, Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise,
                                  Fp8Recipe::kMxfp8};

// Medians of a and b, run in alternation after one warm-up each.
std::pair<double, double> alternate(int repeats, const std::function<void()>& a,
                                    const std::function<void()>& b) {
  a();
  b();
  std::vector<double> ta, tb;
  for (int i = 0; i < repeats; ++i) {
    ta.push_back(seconds_of(a));
    tb.push_back(seconds_of(b));
  }
  return {median(ta), median(tb)};
}

void print_errors(core::Backend& be, int64_t tokens, int64_t d) {
  std::printf(
      "\nRelative GEMM error vs FP64 (||C - C64|| / ||C64||), E4M3 operands; "
      "ratio = CURRENT's error / the recipe's\n");
  std::printf("%-10s %-7s %-18s | %9s %9s %9s %9s | %7s %7s %7s\n", "layer", "pass", "M x N x K",
              "CURRENT", "ROWWISE", "BLOCKWISE", "MXFP8", "row x", "block x", "mx x");
  for (bench::RecipeData data : {bench::RecipeData::kGaussian, bench::RecipeData::kOutlier}) {
    const bool outlier = data == bench::RecipeData::kOutlier;
    std::printf("-- %s\n", outlier ? "one outlier channel 1000x larger (activations, gradients); "
                                     "wgrad: the outputs away from its row and column"
                                   : "Gaussian data");
    double log_sum[4] = {0, 0, 0, 0};
    const std::vector<bench::RecipeGemm> gemms = bench::reference_gemms(tokens, d);
    uint32_t seed = 1;
    for (const bench::RecipeGemm& g : gemms) {
      const bench::RecipeOperands ops = bench::recipe_operands(g, data, seed += 2);
      const std::vector<double> ref = bench::fp64_product(ops);
      double err[4];
      const int64_t skip = outlier && g.pass == "wgrad" ? bench::kOutlierChannel : -1;
      for (int r = 0; r < 4; ++r) {
        err[r] = bench::relative_error(bench::fp8_product(be, kRecipes[r], g, ops), ref, skip);
        log_sum[r] += std::log(err[r]);
      }
      char shape[32];
      std::snprintf(shape, sizeof shape, "%lld x %lld x %lld", static_cast<long long>(g.m),
                    static_cast<long long>(g.n), static_cast<long long>(g.k));
      std::printf("%-10s %-7s %-18s | %9.2e %9.2e %9.2e %9.2e | %7.2f %7.2f %7.2f\n",
                  g.layer.c_str(), g.pass.c_str(), shape, err[0], err[1], err[2], err[3],
                  err[0] / err[1], err[0] / err[2], err[0] / err[3]);
    }
    const double n = static_cast<double>(gemms.size());
    std::printf("%-37s | %9.2e %9.2e %9.2e %9.2e | %7.2f %7.2f %7.2f\n", "geometric mean",
                std::exp(log_sum[0] / n), std::exp(log_sum[1] / n), std::exp(log_sum[2] / n),
                std::exp(log_sum[3] / n), std::exp((log_sum[0] - log_sum[1]) / n),
                std::exp((log_sum[0] - log_sum[2]) / n), std::exp((log_sum[0] - log_sum[3]) / n));
  }
}

// Where per-tensor scaling breaks: the fc projection's weight gradient (outlier channel 7
// along the rows of both operands, K = the tokens) with ever larger outliers, its error over
// the outputs no outlier value feeds (away from row and column 7). Per-tensor scales shrink
// with the outlier and push the other values below E4M3's normal range (2^-6 of its 448) once
// the outlier passes about 10^4 sigma; per-row and per-block scales keep them.
void print_outlier_sweep(core::Backend& be, int64_t tokens, int64_t d) {
  std::printf(
      "\nfc.proj weight gradient, outputs away from the outlier channel, by outlier "
      "size\n");
  std::printf("%-10s | %9s %9s %9s %9s | %7s %7s %7s\n", "outlier", "CURRENT", "ROWWISE",
              "BLOCKWISE", "MXFP8", "row x", "block x", "mx x");
  bench::RecipeGemm wgrad;
  for (const bench::RecipeGemm& g : bench::reference_gemms(tokens, d)) {
    if (g.layer == "fc.proj" && g.pass == "wgrad") wgrad = g;
  }
  for (float factor : {1e3f, 1e4f, 1e5f}) {
    const bench::RecipeOperands ops =
        bench::recipe_operands(wgrad, bench::RecipeData::kOutlier, 77, factor);
    const std::vector<double> ref = bench::fp64_product(ops);
    double err[4];
    for (int r = 0; r < 4; ++r) {
      err[r] = bench::relative_error(bench::fp8_product(be, kRecipes[r], wgrad, ops), ref,
                                     bench::kOutlierChannel);
    }
    std::printf("%-10.0e | %9.2e %9.2e %9.2e %9.2e | %7.2f %7.2f %7.2f\n", factor, err[0], err[1],
                err[2], err[3], err[0] / err[1], err[0] / err[2], err[0] / err[3]);
  }
}

// The three GEMMs of the fc layer: per-tensor FP8 next to each block recipe.
void print_gemm_speed(core::Backend& be, int64_t tokens, int64_t d, int repeats) {
  std::printf(
      "\nCPU GEMM time, median of %d (E4M3 operands, F32 output); each recipe alternates "
      "with a per-tensor run of its own: ratio = that run's time / the recipe's (>= 1: as "
      "fast), tensor ms = the middle of the three per-tensor times\n",
      repeats);
  std::printf("%-10s %-7s %-18s | %11s | %9s %6s | %9s %6s | %9s %6s\n", "layer", "pass",
              "M x N x K", "tensor ms", "ROWWISE", "x", "BLOCKWISE", "x", "MXFP8", "x");
  for (const bench::RecipeGemm& g : bench::reference_gemms(tokens, d)) {
    if (g.layer != "fc" && g.layer != "qkv") continue;
    const bench::RecipeOperands ops = bench::recipe_operands(g, bench::RecipeData::kGaussian, 99);
    core::Tensor c = core::Tensor::empty(core::Shape{g.m, g.n}, core::DType::kF32);
    const auto product = [&](Fp8Recipe recipe) {
      const core::Fp8Operand a = bench::quantize_for_recipe(be, recipe, g.a_role, ops.a);
      const core::Fp8Operand b = bench::quantize_for_recipe(be, recipe, g.b_role, ops.b);
      return [&be, &c, a, b] { core::gemm_k_major(be, a, b, c); };
    };
    const auto tensor = product(Fp8Recipe::kCurrent);
    double ms[3], ratio[3];
    const Fp8Recipe blocks[] = {Fp8Recipe::kRowwise, Fp8Recipe::kBlockwise, Fp8Recipe::kMxfp8};
    double tensor_ms[3];
    for (int r = 0; r < 3; ++r) {
      const auto [t, b] = alternate(repeats, tensor, product(blocks[r]));
      tensor_ms[r] = t * 1e3;
      ms[r] = b * 1e3;
      ratio[r] = t / b;
    }
    std::sort(tensor_ms, tensor_ms + 3);
    char shape[32];
    std::snprintf(shape, sizeof shape, "%lld x %lld x %lld", static_cast<long long>(g.m),
                  static_cast<long long>(g.n), static_cast<long long>(g.k));
    std::printf("%-10s %-7s %-18s | %11.2f | %9.2f %6.2f | %9.2f %6.2f | %9.2f %6.2f\n",
                g.layer.c_str(), g.pass.c_str(), shape, tensor_ms[1], ms[0], ratio[0], ms[1],
                ratio[1], ms[2], ratio[2]);
  }
}

// Block quantisation of a BF16 activation [tokens, 4d] (the fc projection's input) next to a
// memcpy of the same bytes moved (BF16 in, E4M3 codes and the scales out).
void print_quantize_speed(core::Backend& be, int64_t tokens, int64_t d, int repeats) {
  const int64_t rows = tokens, cols = 4 * d;
  core::Tensor x = core::Tensor::empty(core::Shape{rows, cols}, core::DType::kBF16);
  {
    std::mt19937 rng(5);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (int64_t i = 0; i < x.numel(); ++i)
      x.data_as<core::bf16>()[i] = core::bf16_from_float(normal(rng));
  }
  std::printf(
      "\nCPU quantisation with scales of BF16 [%lld, %lld], median of %d; ratio = its "
      "GB/s / memcpy's for the same bytes\n",
      static_cast<long long>(rows), static_cast<long long>(cols), repeats);
  std::printf("%-34s | %8s | %8s | %6s\n", "scales", "GB/s", "memcpy", "ratio");
  struct Case {
    const char* name;
    core::ScaleMode mode;
    bool transpose;
  };
  const Case cases[] = {{"1x128 (BLOCKWISE input)", core::ScaleMode::kVec128, false},
                        {"1x128 along tokens (wgrad input)", core::ScaleMode::kVec128, true},
                        {"128x128 (BLOCKWISE weight)", core::ScaleMode::kBlock128, false},
                        {"per row (ROWWISE)", core::ScaleMode::kOuterVec, false},
                        {"1x32 E8M0 (MXFP8)", core::ScaleMode::kVec32Ue8m0, false}};
  std::vector<char> from(x.nbytes() + static_cast<size_t>(x.numel())), to(from.size());
  for (const Case& c : cases) {
    const int64_t outer = c.transpose ? cols : rows, k = c.transpose ? rows : cols;
    core::Tensor codes = core::Tensor::empty(core::Shape{outer, k}, core::DType::kE4M3);
    core::Tensor scales = core::Tensor::empty(core::Shape{core::scale_count(c.mode, outer, k)},
                                              core::scale_dtype(c.mode));
    core::BlockQuantizeParams p;
    p.mode = c.mode;
    p.transpose = c.transpose;
    const double bytes = static_cast<double>(x.nbytes() + codes.nbytes() + scales.nbytes());
    const size_t half = static_cast<size_t>(bytes / 2);
    const auto [q, m] = alternate(
        repeats, [&] { be.quantize_blocks(x, codes, scales, p); },
        [&] {
#pragma omp parallel
          {
            const size_t threads = static_cast<size_t>(omp_get_num_threads());
            const size_t t = static_cast<size_t>(omp_get_thread_num());
            const size_t piece = (half / threads + 63) / 64 * 64;
            const size_t begin = std::min(half, t * piece);
            const size_t end = std::min(half, begin + piece);
            std::memcpy(to.data() + begin, from.data() + begin, end - begin);
          }
        });
    std::printf("%-34s | %8.2f | %8.2f | %6.2f\n", c.name, bytes / q / 1e9, bytes / m / 1e9, m / q);
  }
}

}  // namespace

static int benchmark_main(int argc, char** argv) {
  const mantissa::bench::Arguments args(
      argc, argv,
      "bench_fp8_recipes [tokens (a multiple of 16) n_embd (a multiple of 32) [repeats >= 1]]");
  args.expect_count_in({0, 2, 3});
  const int64_t tokens = args.whole<int64_t>(1, 2048, 16);
  const int64_t d = args.whole<int64_t>(2, 384, 32);
  const int repeats = args.whole<int>(3, 7, 1);
  // The GEMMs' contractions: n_embd (MXFP8's 32-element blocks) and tokens (the weight
  // gradients, whose FP8 rows are 16-byte aligned).
  if (tokens % 16 != 0 || d % 32 != 0) args.fail();
  std::printf("%s\n", core::cpu_paths_description().c_str());
  std::printf("GEMMs of GPT-2 n_embd %lld, %lld tokens per micro-batch, %d OpenMP threads\n",
              static_cast<long long>(d), static_cast<long long>(tokens), omp_get_max_threads());
  auto be = core::make_cpu_backend();
  print_errors(*be, tokens, d);
  print_outlier_sweep(*be, tokens, d);
  print_gemm_speed(*be, tokens, d, repeats);
  print_quantize_speed(*be, tokens, d, repeats);
  return 0;
}

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_fp8_recipes",
                                         [&] { return benchmark_main(argc, argv); });
}
