// The CPU backend's block-scaled FP8 ops: quantize_blocks against a reference that walks the
// blocks one element at a time (its scalar rules are checked on their own in
// test_block_scaling.cpp), and gemm with scale modes against FP64 sums over the same codes
// and scales (exactly, where every partial sum is exact in FP32), and bit for bit against the
// definition of cpu_gemm_scaled.cpp carried out in FP64 with FP32 rounding at each step, in
// the summation order of the engine the CPU runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/ops/cpu/cpu_gemm_amx.h"
#include "core/ops/cpu/cpu_gemm_bf16.h"
#include "core/ops/cpu_switches.h"
#include "tests/common/test_util.h"

namespace mantissa::core {
namespace {

struct Operand {
  int64_t outer, k;
};

// Gaussian values whose rows have magnitudes spread over 2^-8 .. 2^8, one column 1000x
// larger (an outlier channel) and one all-zero block (rows 0..31 of K-block 1).
Tensor activations(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  Tensor t = Tensor::empty(shape, dtype);
  const int64_t rows = shape[0], cols = shape[1];
  for (int64_t r = 0; r < rows; ++r) {
    const float magnitude = std::ldexp(1.0f, exponent(rng));
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(rng) * magnitude * (c == 3 ? 1000.0f : 1.0f);
      if (r < 32 && c >= 128 && c < 256) v = 0.0f;
      set_value(t, r * cols + c, v);
    }
  }
  return t;
}

// Element (i, kk) of the operand src holds (transposed: src[kk, i]).
double operand_value(const Tensor& src, bool transpose, Operand d, int64_t i, int64_t kk) {
  return value_at(src, transpose ? kk * d.outer + i : i * d.k + kk);
}

struct Quantized {
  Tensor codes, scales;
  float amax = 0.0f;
};

Quantized run_quantize(Backend& be, const Tensor& src, DType code, const BlockQuantizeParams& p0) {
  BlockQuantizeParams p = p0;
  const Operand d{src.dim(p.transpose ? 1 : 0), src.dim(p.transpose ? 0 : 1)};
  Quantized q;
  q.codes = Tensor::empty(Shape{d.outer, d.k}, code);
  q.scales = Tensor::empty(Shape{scale_count(p.mode, d.outer, d.k)}, scale_dtype(p.mode));
  std::memset(q.codes.data(), 0x55, static_cast<size_t>(q.codes.nbytes()));
  std::memset(q.scales.data(), 0x55, static_cast<size_t>(q.scales.nbytes()));
  Tensor amax = f32_scalar(-1.0f);
  p.amax = &amax;
  be.quantize_blocks(src, q.codes, q.scales, p);
  q.amax = amax.data_as<float>()[0];
  return q;
}

// The reference: each block's amax over its elements, its scale, each element's code.
template <class Code>
void expect_reference(const Tensor& src, const Quantized& q, const BlockQuantizeParams& p,
                      const std::string& what) {
  const Operand d{src.dim(p.transpose ? 1 : 0), src.dim(p.transpose ? 0 : 1)};
  const bool mx = p.mode == ScaleMode::kVec32Ue8m0;
  const float fmt_max = fp8_format_max<Code>();
  const int64_t block_rows = scale_block_rows(p.mode, d.outer);
  const int64_t block_k = scale_block_k(p.mode, d.k);
  std::vector<bool> used(static_cast<size_t>(q.scales.numel()), false);
  int mismatches = 0;
  for (int64_t i0 = 0; i0 < d.outer; i0 += block_rows) {
    for (int64_t b = 0; b < scale_k_blocks(p.mode, d.k); ++b) {
      double amax = 0.0;
      for (int64_t i = i0; i < std::min(d.outer, i0 + block_rows); ++i) {
        for (int64_t kk = b * block_k; kk < std::min(d.k, (b + 1) * block_k); ++kk) {
          amax = std::max(amax, std::fabs(operand_value(src, p.transpose, d, i, kk)));
        }
      }
      const int64_t index = scale_index(p.mode, d.outer, d.k, i0, b);
      used[static_cast<size_t>(index)] = true;
      float s;
      if (mx) {
        const uint8_t e = mx_scale_e8m0(static_cast<float>(amax), fmt_max);
        EXPECT_EQ(code_at(q.scales, index), e) << what << " block (" << i0 << ", " << b << ")";
        s = e8m0_to_float(e);
      } else {
        s = block_scale(static_cast<float>(amax), fmt_max, p.power_of_two);
        EXPECT_EQ(value_at(q.scales, index), s) << what << " block (" << i0 << ", " << b << ")";
      }
      for (int64_t i = i0; i < std::min(d.outer, i0 + block_rows); ++i) {
        for (int64_t kk = b * block_k; kk < std::min(d.k, (b + 1) * block_k); ++kk) {
          const float x = static_cast<float>(operand_value(src, p.transpose, d, i, kk));
          const uint8_t want = quantize_with_scale<Code>(x, s).bits;
          if (code_at(q.codes, i * d.k + kk) != want && ++mismatches <= 5) {
            ADD_FAILURE() << what << ": code (" << i << ", " << kk << ") is "
                          << code_at(q.codes, i * d.k + kk) << ", want " << int(want);
          }
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
  // Padding holds the scale of a zero block.
  for (int64_t i = 0; i < q.scales.numel(); ++i) {
    if (used[static_cast<size_t>(i)]) continue;
    if (mx) {
      EXPECT_EQ(code_at(q.scales, i), 127u) << what << " padding " << i;
    } else {
      EXPECT_EQ(value_at(q.scales, i), 1.0) << what << " padding " << i;
    }
  }
  double amax = 0.0;
  for (int64_t i = 0; i < src.numel(); ++i) amax = std::max(amax, std::fabs(value_at(src, i)));
  EXPECT_EQ(q.amax, static_cast<float>(amax)) << what;
}

TEST(CpuQuantizeBlocks, MatchesTheBlockByBlockReference) {
  auto be = make_cpu_backend();
  const ScaleMode modes[] = {ScaleMode::kVec128, ScaleMode::kBlock128, ScaleMode::kOuterVec,
                             ScaleMode::kVec32Ue8m0};
  // 260 rows: a partial 128-row block; K = 400: a partial 128- and 32-element block.
  for (const Shape& shape : {Shape{260, 384}, Shape{136, 400}}) {
    for (DType src_dtype : {DType::kF32, DType::kBF16}) {
      const Tensor src = activations(shape, src_dtype, 11);
      for (ScaleMode mode : modes) {
        for (bool transpose : {false, true}) {
          for (bool pow2 : {false, true}) {
            for (DType code : {DType::kE4M3, DType::kE5M2}) {
              BlockQuantizeParams p;
              p.mode = mode;
              p.transpose = transpose;
              p.power_of_two = pow2;
              const std::string what = std::string(scale_mode_name(mode)) + " " +
                                       dtype_name(src_dtype) + "->" + dtype_name(code) +
                                       (transpose ? " transposed" : "") + (pow2 ? " pow2" : "") +
                                       " " + shape.str();
              const Quantized q = run_quantize(*be, src, code, p);
              if (code == DType::kE4M3) {
                expect_reference<fp8_e4m3>(src, q, p, what);
              } else {
                expect_reference<fp8_e5m2>(src, q, p, what);
              }
            }
          }
        }
      }
    }
  }
}

TEST(CpuQuantizeBlocks, ResultsDoNotDependOnTheThreadCount) {
  auto be = make_cpu_backend();
  const Tensor src = activations(Shape{1024, 512}, DType::kBF16, 12);
  for (ScaleMode mode : {ScaleMode::kVec128, ScaleMode::kBlock128}) {
    for (bool transpose : {false, true}) {
      BlockQuantizeParams p;
      p.mode = mode;
      p.transpose = transpose;
      Quantized one, two;
      with_threads(1, [&] { one = run_quantize(*be, src, DType::kE4M3, p); });
      with_threads(2, [&] { two = run_quantize(*be, src, DType::kE4M3, p); });
      EXPECT_EQ(std::memcmp(one.codes.data(), two.codes.data(), one.codes.nbytes()), 0);
      EXPECT_EQ(std::memcmp(one.scales.data(), two.scales.data(), one.scales.nbytes()), 0);
    }
  }
}

// The weight's transposed copy for the backward GEMMs: the 128x128 blocks of W^T are the
// transposes of W's, so its codes are W's codes transposed and its scales W's block scales.
TEST(CpuQuantizeBlocks, TransposedSquareBlocksAreTheTransposedBlocks) {
  auto be = make_cpu_backend();
  const Tensor w = activations(Shape{384, 256}, DType::kBF16, 13);
  BlockQuantizeParams p;
  p.mode = ScaleMode::kBlock128;
  const Quantized fwd = run_quantize(*be, w, DType::kE4M3, p);
  p.transpose = true;
  const Quantized bwd = run_quantize(*be, w, DType::kE4M3, p);
  for (int64_t i = 0; i < 384; ++i) {
    for (int64_t j = 0; j < 256; ++j) {
      ASSERT_EQ(code_at(bwd.codes, j * 384 + i), code_at(fwd.codes, i * 256 + j));
    }
  }
  for (int64_t bi = 0; bi < 3; ++bi) {
    for (int64_t bj = 0; bj < 2; ++bj) {
      EXPECT_EQ(value_at(bwd.scales, scale_index(p.mode, 256, 384, bj * 128, bi)),
                value_at(fwd.scales, scale_index(p.mode, 384, 256, bi * 128, bj)));
    }
  }
}

TEST(CpuQuantizeBlocks, NonFiniteBlocksKeepTheirSignal) {
  auto be = make_cpu_backend();
  Tensor src = activations(Shape{4, 256}, DType::kF32, 14);
  src.data_as<float>()[5] = NAN;             // row 0, block 0
  src.data_as<float>()[256 + 7] = INFINITY;  // row 1, block 0
  BlockQuantizeParams p;
  const Quantized q = run_quantize(*be, src, DType::kE4M3, p);
  EXPECT_EQ(value_at(q.scales, scale_index(p.mode, 4, 256, 0, 0)), 1.0);
  EXPECT_EQ(value_at(q.scales, scale_index(p.mode, 4, 256, 1, 0)), 1.0);
  EXPECT_TRUE(std::isnan(value_at(q.codes, 5)));
  EXPECT_EQ(value_at(q.codes, 256 + 7), 448.0);
  EXPECT_TRUE(std::isnan(q.amax));
}

// accumulate_amax: the larger of the held amax and this tensor's; a NaN stays.
TEST(CpuQuantizeBlocks, AmaxAccumulates) {
  auto be = make_cpu_backend();
  Tensor codes = Tensor::empty(Shape{4, 128}, DType::kE4M3);
  Tensor scales = Tensor::empty(Shape{scale_count(ScaleMode::kVec128, 4, 128)}, DType::kF32);
  Tensor amax = f32_scalar(3.0f);
  BlockQuantizeParams p;
  p.amax = &amax;
  p.accumulate_amax = true;
  const auto quantize = [&](float peak) {
    Tensor src = Tensor::empty(Shape{4, 128}, DType::kF32);
    be->fill(src, 0.25f);
    src.data_as<float>()[130] = peak;
    be->quantize_blocks(src, codes, scales, p);
    return amax.data_as<float>()[0];
  };
  EXPECT_EQ(quantize(-2.0f), 3.0f);
  EXPECT_EQ(quantize(-7.0f), 7.0f);
  EXPECT_TRUE(std::isnan(quantize(NAN)));
  EXPECT_TRUE(std::isnan(quantize(1.0f)));
  p.accumulate_amax = false;
  EXPECT_EQ(quantize(1.0f), 1.0f);
}

TEST(CpuQuantizeBlocks, RefusesBadCalls) {
  auto be = make_cpu_backend();
  Tensor src = Tensor::empty(Shape{8, 256}, DType::kF32);
  be->fill(src, 1.0f);
  Tensor codes = Tensor::empty(Shape{8, 256}, DType::kE4M3);
  Tensor scales = Tensor::empty(Shape{15}, DType::kF32);
  BlockQuantizeParams p;
  expect_error([&] { be->quantize_blocks(src, codes, scales, p); }, {"quantize_blocks", "scales"});
  Tensor ok_scales = Tensor::empty(Shape{scale_count(p.mode, 8, 256)}, DType::kF32);
  Tensor wrong_codes = Tensor::empty(Shape{256, 8}, DType::kE4M3);
  expect_error([&] { be->quantize_blocks(src, wrong_codes, ok_scales, p); }, {"codes"});
  p.mode = ScaleMode::kTensor;
  expect_error([&] { be->quantize_blocks(src, codes, ok_scales, p); }, {"cast()"});
  p.mode = ScaleMode::kVec32Ue8m0;
  expect_error([&] { be->quantize_blocks(src, codes, ok_scales, p); }, {"scales", "u8"});
}

// ---------------------------------------------------------------------------------------
// gemm with scale modes.

// Random finite codes of `dtype`, as a tensor of shape `shape`; `small` keeps them to the
// integers -4..4, whose products and sums of up to 2^20 terms are exact in FP32.
Tensor random_codes(const Shape& shape, DType dtype, std::mt19937& rng, bool small) {
  Tensor t = Tensor::empty(shape, dtype);
  std::uniform_int_distribution<int> byte(0, 255), integer(-4, 4);
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (small) {
      set_value(t, i, static_cast<float>(integer(rng)));
      continue;
    }
    uint8_t c;
    do {
      c = static_cast<uint8_t>(byte(rng));
    } while (!std::isfinite(decode(dtype, c)));
    set_code(t, i, c);
  }
  return t;
}

// Random scales for an operand: any positive F32 in 2^-6 .. 2^7, or powers of two in 2^-2 ..
// 2^2 (`exact`: with the small codes every scaled partial sum and their sum stay exact).
Tensor random_scales(ScaleMode mode, Operand d, std::mt19937& rng, bool exact) {
  Tensor t = Tensor::empty(Shape{scale_count(mode, d.outer, d.k)}, scale_dtype(mode));
  std::uniform_int_distribution<int> exponent(exact ? -2 : -6, exact ? 2 : 6);
  std::uniform_real_distribution<float> mantissa(1.0f, 2.0f);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int e = exponent(rng);
    if (mode == ScaleMode::kVec32Ue8m0) {
      set_code(t, i, static_cast<uint64_t>(127 + e));
    } else {
      t.data_as<float>()[i] = std::ldexp(exact ? 1.0f : mantissa(rng), e);
    }
  }
  return t;
}

struct Problem {
  int64_t m, n, k;
  ScaleMode a_mode, b_mode;
  Tensor a, b;  // TN storage: A [M, K], B [N, K]
  Tensor a_scale, b_scale;
};

Problem make_problem(int64_t m, int64_t n, int64_t k, ScaleMode a_mode, ScaleMode b_mode,
                     uint32_t seed, bool exact) {
  std::mt19937 rng(seed);
  Problem pr{m, n, k, a_mode, b_mode, {}, {}, {}, {}};
  pr.a = random_codes(Shape{m, k}, DType::kE4M3, rng, exact);
  pr.b = random_codes(Shape{n, k}, exact ? DType::kE4M3 : DType::kE5M2, rng, exact);
  pr.a_scale = random_scales(a_mode, {m, k}, rng, exact);
  pr.b_scale = random_scales(b_mode, {n, k}, rng, exact);
  return pr;
}

double scale_of(const Tensor& scales, ScaleMode mode, Operand d, int64_t i, int64_t b) {
  return scale_at(scales.data(), mode, scale_index(mode, d.outer, d.k, i, b));
}

// FP64: sum over blocks of sa sb (sum over the block of a b); also the sum of magnitudes of
// the terms, which bounds FP32's rounding errors.
void reference(const Problem& pr, int64_t i, int64_t j, double& value, double& magnitude) {
  const int64_t block_k = scale_block_k(pr.a_mode, pr.k);
  value = magnitude = 0.0;
  for (int64_t b = 0; b < scale_k_blocks(pr.a_mode, pr.k); ++b) {
    double sum = 0.0, abs_sum = 0.0;
    for (int64_t kk = b * block_k; kk < std::min(pr.k, (b + 1) * block_k); ++kk) {
      const double t = value_at(pr.a, i * pr.k + kk) * value_at(pr.b, j * pr.k + kk);
      sum += t;
      abs_sum += std::fabs(t);
    }
    const double s = scale_of(pr.a_scale, pr.a_mode, {pr.m, pr.k}, i, b) *
                     scale_of(pr.b_scale, pr.b_mode, {pr.n, pr.k}, j, b);
    value += s * sum;
    magnitude += s * abs_sum;
  }
}

Tensor run_gemm(Backend& be, const Problem& pr, DType out, float alpha = 1.0f, float beta = 0.0f,
                const Tensor* c_in = nullptr) {
  Tensor c = Tensor::empty(Shape{pr.m, pr.n}, out);
  if (c_in != nullptr) {
    be.copy(*c_in, c);
  } else {
    poison(c);
  }
  GemmParams p;
  p.trans_b = true;
  p.alpha = alpha;
  p.beta = beta;
  p.a_scale = &pr.a_scale;
  p.b_scale = &pr.b_scale;
  p.a_scale_mode = pr.a_mode;
  p.b_scale_mode = pr.b_mode;
  be.gemm(pr.a, pr.b, c, p);
  return c;
}

struct Pair {
  ScaleMode a, b;
};
constexpr Pair kPairs[] = {{ScaleMode::kVec128, ScaleMode::kVec128},
                           {ScaleMode::kVec128, ScaleMode::kBlock128},
                           {ScaleMode::kBlock128, ScaleMode::kVec128},
                           {ScaleMode::kOuterVec, ScaleMode::kOuterVec},
                           {ScaleMode::kVec32Ue8m0, ScaleMode::kVec32Ue8m0}};

std::string pair_name(Pair p) {
  return std::string(scale_mode_name(p.a)) + " x " + scale_mode_name(p.b);
}

TEST(CpuScaledGemm, MatchesFp64WithTheSameScales) {
  auto be = make_cpu_backend();
  for (Pair pair : kPairs) {
    // K = 400: a partial last block of 128 (and of 32 for MXFP8 it is whole).
    for (int64_t k : {384, 400}) {
      const Problem pr = make_problem(136, 136, k, pair.a, pair.b, 21, false);
      for (DType out : {DType::kF32, DType::kBF16}) {
        const Tensor c = run_gemm(*be, pr, out);
        const int64_t block_k = scale_block_k(pair.a, k);
        const double u = std::ldexp(1.0, -24);
        int bad = 0;
        for (int64_t i = 0; i < pr.m; ++i) {
          for (int64_t j = 0; j < pr.n; ++j) {
            double want, magnitude;
            reference(pr, i, j, want, magnitude);
            // FP32 partial sums (block_k terms), one scale product, L accumulations.
            double bound = 2.0 * (block_k + scale_k_blocks(pair.a, k) + 2) * u * magnitude;
            if (out == DType::kBF16) bound += half_ulp(DType::kBF16, std::fabs(want)) * 1.01;
            const double got = value_at(c, i * pr.n + j);
            if (!(std::fabs(got - want) <= bound) && ++bad <= 5) {
              ADD_FAILURE() << pair_name(pair) << " K " << k << " -> " << dtype_name(out) << " ("
                            << i << ", " << j << "): " << got << " vs FP64 " << want << " (bound "
                            << bound << ")";
            }
          }
        }
        EXPECT_EQ(bad, 0) << pair_name(pair);
      }
    }
  }
}

TEST(CpuScaledGemm, ExactWhereEveryPartialSumIsExact) {
  auto be = make_cpu_backend();
  for (Pair pair : kPairs) {
    const Problem pr = make_problem(64, 48, 256, pair.a, pair.b, 22, true);
    const Tensor c = run_gemm(*be, pr, DType::kF32, 0.5f);
    for (int64_t i = 0; i < pr.m; ++i) {
      for (int64_t j = 0; j < pr.n; ++j) {
        double want, magnitude;
        reference(pr, i, j, want, magnitude);
        ASSERT_EQ(value_at(c, i * pr.n + j), 0.5 * want) << pair_name(pair) << " " << i << " " << j;
      }
    }
  }
}

TEST(CpuScaledGemm, EqualBlockScalesGiveThePerTensorProduct) {
  auto be = make_cpu_backend();
  Problem pr = make_problem(64, 32, 384, ScaleMode::kVec128, ScaleMode::kBlock128, 23, true);
  for (Tensor* s : {&pr.a_scale, &pr.b_scale}) {
    for (int64_t i = 0; i < s->numel(); ++i) s->data_as<float>()[i] = 0.25f;
  }
  const Tensor blocks = run_gemm(*be, pr, DType::kF32);
  Tensor tensor = Tensor::empty(Shape{pr.m, pr.n}, DType::kF32);
  GemmParams p;
  p.trans_b = true;
  const Tensor quarter = f32_scalar(0.25f);
  p.a_scale = &quarter;
  p.b_scale = &quarter;
  be->gemm(pr.a, pr.b, tensor, p);
  EXPECT_EQ(std::memcmp(blocks.data(), tensor.data(), blocks.nbytes()), 0);
}

// The scales belong to op(A)'s and op(B)^T's rows whatever the storage: every transpose
// combination gives the TN product's bits.
TEST(CpuScaledGemm, StorageTransposesDoNotChangeTheResult) {
  auto be = make_cpu_backend();
  const Problem pr = make_problem(96, 64, 256, ScaleMode::kVec128, ScaleMode::kBlock128, 24, false);
  const Tensor want = run_gemm(*be, pr, DType::kF32);
  const auto transposed = [](const Tensor& x) {
    Tensor t = Tensor::empty(Shape{x.dim(1), x.dim(0)}, x.dtype());
    for (int64_t r = 0; r < x.dim(0); ++r) {
      for (int64_t c = 0; c < x.dim(1); ++c)
        set_code(t, c * x.dim(0) + r, code_at(x, r * x.dim(1) + c));
    }
    return t;
  };
  const Tensor a_t = transposed(pr.a), b_t = transposed(pr.b);
  for (bool trans_a : {false, true}) {
    for (bool trans_b : {false, true}) {
      Tensor c = Tensor::empty(Shape{pr.m, pr.n}, DType::kF32);
      GemmParams p;
      p.trans_a = trans_a;
      p.trans_b = trans_b;
      p.a_scale = &pr.a_scale;
      p.b_scale = &pr.b_scale;
      p.a_scale_mode = pr.a_mode;
      p.b_scale_mode = pr.b_mode;
      be->gemm(trans_a ? a_t : pr.a, trans_b ? pr.b : b_t, c, p);
      EXPECT_EQ(std::memcmp(c.data(), want.data(), c.nbytes()), 0)
          << "trans_a " << trans_a << " trans_b " << trans_b;
    }
  }
}

TEST(CpuScaledGemm, AccumulatesIntoCWithBeta) {
  auto be = make_cpu_backend();
  const Problem pr = make_problem(64, 48, 256, ScaleMode::kVec128, ScaleMode::kVec128, 25, true);
  Tensor start = Tensor::empty(Shape{pr.m, pr.n}, DType::kF32);
  for (int64_t i = 0; i < start.numel(); ++i) start.data_as<float>()[i] = static_cast<float>(i % 7);
  const Tensor c = run_gemm(*be, pr, DType::kF32, 1.0f, 1.0f, &start);
  for (int64_t i = 0; i < pr.m; ++i) {
    for (int64_t j = 0; j < pr.n; ++j) {
      double want, magnitude;
      reference(pr, i, j, want, magnitude);
      ASSERT_EQ(value_at(c, i * pr.n + j), want + static_cast<double>((i * pr.n + j) % 7));
    }
  }
}

TEST(CpuScaledGemm, ResultsDoNotDependOnTheThreadCount) {
  auto be = make_cpu_backend();
  const Problem pr =
      make_problem(512, 384, 384, ScaleMode::kVec128, ScaleMode::kBlock128, 26, false);
  Tensor one, two;
  with_threads(1, [&] { one = run_gemm(*be, pr, DType::kBF16); });
  with_threads(2, [&] { two = run_gemm(*be, pr, DType::kBF16); });
  EXPECT_EQ(std::memcmp(one.data(), two.data(), one.nbytes()), 0);
}

// The engines a scaled GEMM can run on, each with its own order of summing a K-block.
enum class Engine {
  kPairs,       // VDPBF16PS: each pair's k + 1 product, then its k product
  kSequential,  // the AVX2 kernel: increasing k
  kTiles,       // AMX: the order inside one TDPBF16PS is the hardware's own
};

Engine engine_of_this_cpu() {
  if (!bf16_gemm_enabled()) return Engine::kSequential;
  return amx::enabled() ? Engine::kTiles : Engine::kPairs;
}

// Op(A)'s and op(B)'s slice of K [k0, k1) (TN storage: rows of K FP8 codes).
Tensor k_slice(const Tensor& codes, int64_t k0, int64_t k1) {
  const int64_t rows = codes.dim(0), k = codes.dim(1);
  Tensor slice = Tensor::empty(Shape{rows, k1 - k0}, codes.dtype());
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(static_cast<uint8_t*>(slice.data()) + r * (k1 - k0),
                static_cast<const uint8_t*>(codes.data()) + r * k + k0,
                static_cast<size_t>(k1 - k0));
  }
  return slice;
}

// The definition at the top of cpu_gemm_scaled.cpp, element by element: each K-block's sum
// P_b in FP32 from +0 in the order of the engine the backend runs (Engine), acc = fma(sa sb,
// P_b, acc) from acc = +0, then
// C = alpha acc (+ beta C in one fma), a BF16 C rounded once. The products and each rounded
// addition are done in FP64 and rounded to FP32: a product of two FP8 values is exact in both,
// and FP64 holds the exact sum of two FP32 values closely enough (53 >= 2 * 24 + 2 bits) that
// rounding it to FP32 gives the FP32 sum. On AMX tiles, whose order inside an instruction is
// not written down, P_b is the backend's unscaled GEMM of the block's slices of K instead (the
// same tile instructions, held to FP64 by test_cpu_gemm): what this test then holds to the
// definition is the folding of the blocks.
class ScaledGemmDefinition {
 public:
  ScaledGemmDefinition(Backend& be, const Problem& pr, Engine engine) : pr_(pr), engine_(engine) {
    if (engine_ != Engine::kTiles) return;
    const int64_t block_k = scale_block_k(pr_.a_mode, pr_.k);
    for (int64_t k0 = 0; k0 < pr_.k; k0 += block_k) {
      const int64_t k1 = std::min(pr_.k, k0 + block_k);
      Tensor sums = Tensor::empty(Shape{pr_.m, pr_.n}, DType::kF32);
      GemmParams p;
      p.trans_b = true;
      be.gemm(k_slice(pr_.a, k0, k1), k_slice(pr_.b, k0, k1), sums, p);
      tile_sums_.push_back(std::move(sums));
    }
  }

  // acc[i, j] after the last K-block.
  float accumulator(int64_t i, int64_t j) const {
    const int64_t block_k = scale_block_k(pr_.a_mode, pr_.k);
    float acc = 0.0f;
    for (int64_t b = 0; b < scale_k_blocks(pr_.a_mode, pr_.k); ++b) {
      const int64_t k0 = b * block_k, k1 = std::min(pr_.k, k0 + block_k);
      const double sa = scale_of(pr_.a_scale, pr_.a_mode, {pr_.m, pr_.k}, i, b);
      const double sb = scale_of(pr_.b_scale, pr_.b_mode, {pr_.n, pr_.k}, j, b);
      acc = std::fma(static_cast<float>(sa * sb), block_sum(i, j, b, k0, k1), acc);
    }
    return acc;
  }

 private:
  double product(int64_t i, int64_t j, int64_t kk) const {
    return value_at(pr_.a, i * pr_.k + kk) * value_at(pr_.b, j * pr_.k + kk);
  }
  static float add(float sum, double term) {
    return static_cast<float>(static_cast<double>(sum) + term);
  }
  float block_sum(int64_t i, int64_t j, int64_t b, int64_t k0, int64_t k1) const {
    if (engine_ == Engine::kTiles) return tile_sums_[b].data_as<float>()[i * pr_.n + j];
    const bool pairs = engine_ == Engine::kPairs;
    float sum = 0.0f;
    for (int64_t kk = k0; kk < k1; kk += pairs ? 2 : 1) {
      if (pairs) sum = add(sum, kk + 1 < k1 ? product(i, j, kk + 1) : 0.0);
      sum = add(sum, product(i, j, kk));
    }
    return sum;
  }

  const Problem& pr_;
  Engine engine_;
  std::vector<Tensor> tile_sums_;  // kTiles: P_b as [m, n] per block
};

// Negative multipliers (the definition takes any F32 scale) on the F32 scales of a random
// quarter of the entries and on every scale of op(A)'s row `row`; E8M0 scales have no sign.
void negate_some_scales(Tensor& scales, ScaleMode mode, Operand d, int64_t row, std::mt19937& rng) {
  if (mode == ScaleMode::kVec32Ue8m0) return;
  float* v = scales.data_as<float>();
  std::uniform_int_distribution<int> quarter(0, 3);
  for (int64_t i = 0; i < scales.numel(); ++i) {
    if (quarter(rng) == 0) v[i] = -v[i];
  }
  if (row < 0) return;
  for (int64_t b = 0; b < scale_k_blocks(mode, d.k); ++b) {
    float& s = v[scale_index(mode, d.outer, d.k, row, b)];
    s = -std::fabs(s);
  }
}

// Bit for bit: every scale pair, F32 and BF16 outputs, beta 0 (C unread) and not, shapes with
// edge tiles, a short last K-block, K past the AVX2 kernel's K blocks of 256, a C narrow enough
// to be cut into column slices, and 1 and 2 threads. Row 1 of A is zero and its scales
// negative, so every block's product there is -0: the first block's fma onto +0 keeps acc at
// +0 (a plain product would start it at -0 and C would come out -0); row 2 is zero in the
// first K-block only.
TEST(CpuScaledGemm, BitExactToTheDefinitionInTheEnginesOrder) {
  auto be = make_cpu_backend();
  const Engine engine = engine_of_this_cpu();
  SCOPED_TRACE(cpu_paths_description());
  struct Size {
    int64_t m, n, k;
  };
  for (Pair pair : kPairs) {
    for (Size size : {Size{152, 72, 656}, Size{152, 72, 400}, Size{24, 200, 304}}) {
      Problem pr = make_problem(size.m, size.n, size.k, pair.a, pair.b, 31, false);
      std::mt19937 rng(32);
      for (int64_t kk = 0; kk < pr.k; ++kk) {
        set_value(pr.a, 1 * pr.k + kk, 0.0f);
        if (kk < scale_block_k(pair.a, pr.k)) set_value(pr.a, 2 * pr.k + kk, 0.0f);
      }
      negate_some_scales(pr.a_scale, pair.a, {pr.m, pr.k}, 1, rng);
      negate_some_scales(pr.b_scale, pair.b, {pr.n, pr.k}, -1, rng);
      const ScaledGemmDefinition definition(*be, pr, engine);
      std::vector<float> acc(static_cast<size_t>(pr.m * pr.n));
      for (int64_t i = 0; i < pr.m; ++i) {
        for (int64_t j = 0; j < pr.n; ++j) acc[i * pr.n + j] = definition.accumulator(i, j);
      }
      if (pair.a != ScaleMode::kVec32Ue8m0) {
        ASSERT_TRUE(acc[1 * pr.n] == 0.0f && !std::signbit(acc[1 * pr.n])) << pair_name(pair);
      }
      for (DType out : {DType::kF32, DType::kBF16}) {
        Tensor start = Tensor::empty(Shape{pr.m, pr.n}, out);
        std::normal_distribution<float> normal(0.0f, 4.0f);
        for (int64_t e = 0; e < start.numel(); ++e) set_value(start, e, normal(rng));
        for (float beta : {0.0f, 0.5f}) {
          const float alpha = 0.75f;
          for (int threads : {1, 2}) {
            Tensor c;
            with_threads(threads, [&] {
              c = run_gemm(*be, pr, out, alpha, beta, beta == 0.0f ? nullptr : &start);
            });
            int bad = 0;
            for (int64_t e = 0; e < c.numel(); ++e) {
              float want = alpha * acc[e];
              if (beta != 0.0f) want = std::fma(beta, static_cast<float>(value_at(start, e)), want);
              const uint64_t want_code =
                  out == DType::kF32 ? float_to_bits(want) : bf16_from_float(want).bits;
              if (code_at(c, e) != want_code && ++bad <= 5) {
                ADD_FAILURE() << pair_name(pair) << " " << pr.m << " x " << pr.n << " x " << pr.k
                              << " -> " << dtype_name(out) << " beta " << beta << ", " << threads
                              << " threads, (" << e / pr.n << ", " << e % pr.n
                              << "): " << value_at(c, e) << " vs " << want;
              }
            }
            EXPECT_EQ(bad, 0) << pair_name(pair);
          }
        }
      }
    }
  }
}

TEST(CpuScaledGemm, RefusesWhatCublasLtRefuses) {
  auto be = make_cpu_backend();
  Problem pr = make_problem(64, 48, 256, ScaleMode::kVec128, ScaleMode::kVec128, 27, true);
  Tensor c = Tensor::empty(Shape{pr.m, pr.n}, DType::kF32);
  const auto params = [&] {
    GemmParams p;
    p.trans_b = true;
    p.a_scale = &pr.a_scale;
    p.b_scale = &pr.b_scale;
    p.a_scale_mode = pr.a_mode;
    p.b_scale_mode = pr.b_mode;
    return p;
  };
  GemmParams p = params();
  p.a_scale_mode = p.b_scale_mode = ScaleMode::kBlock128;
  expect_error([&] { be->gemm(pr.a, pr.b, c, p); }, {"gemm", "not a pair"});
  p = params();
  p.fast_accumulate = true;
  expect_error([&] { be->gemm(pr.a, pr.b, c, p); }, {"fast_accumulate"});
  p = params();
  p.b_scale = nullptr;
  expect_error([&] { be->gemm(pr.a, pr.b, c, p); }, {"b_scale", "missing"});
  p = params();
  Tensor short_scales = Tensor::empty(Shape{3}, DType::kF32);
  p.a_scale = &short_scales;
  expect_error([&] { be->gemm(pr.a, pr.b, c, p); }, {"a_scale", "needs"});
  p = params();
  Tensor c8 = Tensor::empty(Shape{pr.m, pr.n}, DType::kE4M3);
  expect_error([&] { be->gemm(pr.a, pr.b, c8, p); }, {"f32 or bf16"});
  // 1x128 scales need rows in multiples of 8 (4 is cuBLASLt's rule; see scale_rows_multiple).
  Problem odd = make_problem(12, 48, 256, ScaleMode::kVec128, ScaleMode::kVec128, 28, true);
  Tensor c_odd = Tensor::empty(Shape{12, 48}, DType::kF32);
  odd.a_scale = Tensor::empty(Shape{scale_count(ScaleMode::kVec128, 12, 256)}, DType::kF32);
  p = params();
  p.a_scale = &odd.a_scale;
  expect_error([&] { be->gemm(odd.a, pr.b, c_odd, p); }, {"multiple of 8"});
  EXPECT_EQ(be->unsupported_scale_modes(ScaleMode::kVec128, ScaleMode::kBlock128), "");
  EXPECT_EQ(be->unsupported_scale_modes(ScaleMode::kVec32Ue8m0, ScaleMode::kVec32Ue8m0), "");
  EXPECT_NE(be->unsupported_scale_modes(ScaleMode::kBlock128, ScaleMode::kBlock128), "");
}

}  // namespace
}  // namespace mantissa::core
