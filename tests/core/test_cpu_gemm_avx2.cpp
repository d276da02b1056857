// The AVX2/FMA GEMM (core/ops/cpu/cpu_gemm_avx2.h), called directly, whatever the CPU or the
// MANTISSA_CPU_* switches (test_cpu_gemm.cpp checks the backend's GEMM, which routes to it,
// against FP64 on both switch settings).
//
// The kernel promises one FP32 sum per element over k = 0 .. K-1 in increasing order, each
// step a fused multiply-add of the exactly widened operands, then alpha times the sum plus
// beta * C in one more fused multiply-add, and for a BF16 C one rounding to nearest even. The
// reference here computes exactly that with scalar std::fma on values decoded by dtype.h, so
// every result must be bit-identical: for any shape (odd M, N, K, K = 1, K past a cache block,
// C past the row and column blocks), transposes, alpha and beta, batch, and 1 or 2 threads.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/ops/cpu/cpu_gemm_avx2.h"
#include "core/tensor/tensor.h"
#include "tests/common/test_util.h"

namespace mantissa::core {
namespace {

// Values over many binades, with zeros, BF16/F16 subnormals and a few large ones. FP8 codes
// span the format's range (no NaN: test_cpu_gemm.cpp covers propagation).
Tensor random_operand(const Shape& shape, DType dtype, std::mt19937& rng) {
  const float range = dtype == DType::kE4M3 ? 400.0f : dtype == DType::kE5M2 ? 50000.0f : 4.0f;
  std::uniform_real_distribution<float> uniform(-range, range);
  std::uniform_int_distribution<int> shift(0, 12), special(0, 63);
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    float x = std::ldexp(uniform(rng), -shift(rng));
    const int pick = special(rng);
    if (pick == 0) x = 0.0f;
    if (pick == 1 && (dtype == DType::kBF16 || dtype == DType::kF32)) x = std::ldexp(x, -128);
    if (pick == 2 && dtype == DType::kF16) x = std::ldexp(1.0f, -20);  // an F16 subnormal
    set_value(t, i, x);
  }
  return t;
}

struct Case {
  DType a, b, c;
  int64_t batch, m, n, k;
  bool trans_a, trans_b;
  float alpha, beta;
};

std::string describe(const Case& cs) {
  std::ostringstream out;
  out << dtype_name(cs.a) << " x " << dtype_name(cs.b) << " -> " << dtype_name(cs.c) << " batch "
      << cs.batch << " m " << cs.m << " n " << cs.n << " k " << cs.k << " trans " << cs.trans_a
      << cs.trans_b << " alpha " << cs.alpha << " beta " << cs.beta;
  return out.str();
}

// The kernel's arithmetic, one element at a time, in scalar code.
std::vector<uint32_t> reference_codes(const Case& cs, const Tensor& a, const Tensor& b,
                                      const Tensor& c0) {
  std::vector<uint32_t> codes(static_cast<size_t>(cs.batch * cs.m * cs.n));
  // op(A) and op(B)^T of one product, decoded exactly.
  std::vector<float> op_a(cs.m * cs.k), op_b_t(cs.n * cs.k);
  for (int64_t p = 0; p < cs.batch; ++p) {
    for (int64_t i = 0; i < cs.m; ++i) {
      for (int64_t l = 0; l < cs.k; ++l) {
        const int64_t at = p * cs.m * cs.k + (cs.trans_a ? l * cs.m + i : i * cs.k + l);
        op_a[i * cs.k + l] = static_cast<float>(value_at(a, at));
      }
    }
    for (int64_t j = 0; j < cs.n; ++j) {
      for (int64_t l = 0; l < cs.k; ++l) {
        const int64_t at = p * cs.k * cs.n + (cs.trans_b ? j * cs.k + l : l * cs.n + j);
        op_b_t[j * cs.k + l] = static_cast<float>(value_at(b, at));
      }
    }
    for (int64_t i = 0; i < cs.m; ++i) {
      for (int64_t j = 0; j < cs.n; ++j) {
        float acc = 0.0f;
        for (int64_t l = 0; l < cs.k; ++l)
          acc = std::fma(op_a[i * cs.k + l], op_b_t[j * cs.k + l], acc);
        const int64_t e = (p * cs.m + i) * cs.n + j;
        float out = cs.alpha * acc;
        if (cs.beta != 0.0f) out = std::fma(cs.beta, static_cast<float>(value_at(c0, e)), out);
        codes[e] = encode(cs.c, out);
      }
    }
  }
  return codes;
}

void run_case(const Case& cs, uint32_t seed) {
  SCOPED_TRACE(describe(cs));
  std::mt19937 rng(seed);
  const auto shape = [&](int64_t rows, int64_t cols) {
    return cs.batch > 1 ? Shape{cs.batch, rows, cols} : Shape{rows, cols};
  };
  const Tensor a = random_operand(cs.trans_a ? shape(cs.k, cs.m) : shape(cs.m, cs.k), cs.a, rng);
  const Tensor b = random_operand(cs.trans_b ? shape(cs.n, cs.k) : shape(cs.k, cs.n), cs.b, rng);
  Tensor c0 = Tensor::empty(shape(cs.m, cs.n), cs.c);
  if (cs.beta != 0.0f) {
    std::uniform_real_distribution<float> uniform(-2.0f, 2.0f);
    for (int64_t i = 0; i < c0.numel(); ++i) set_value(c0, i, uniform(rng));
  } else {
    poison(c0);  // beta = 0 must not read C: NaN there must not reach the result
  }
  const std::vector<uint32_t> expected = reference_codes(cs, a, b, c0);

  const GemmShape s{cs.batch, cs.m, cs.n, cs.k};
  for (int threads : {1, 2}) {
    SCOPED_TRACE("threads " + std::to_string(threads));
    Tensor c = Tensor::empty(c0.shape(), cs.c);
    std::memcpy(c.data(), c0.data(), c0.nbytes());
    with_threads(threads, [&] {
      gemm_avx2(s, a, cs.trans_a, b, cs.trans_b, cs.alpha, cs.beta, c.data(), cs.c);
    });
    int failures = 0;
    for (int64_t e = 0; e < c.numel(); ++e) {
      const uint32_t got = static_cast<uint32_t>(code_at(c, e));
      if (got != expected[e] && failures++ < 5) {
        ADD_FAILURE() << "element " << e << ": got " << value_at(c, e) << " (code " << got
                      << "), expected " << decode(cs.c, expected[e]) << " (code " << expected[e]
                      << ")";
      }
    }
    EXPECT_EQ(failures, 0);
  }
}

struct Dims {
  int64_t m, n, k;
};

using Pairs = std::vector<std::pair<DType, DType>>;

const Pairs kOperandPairs = {
    {DType::kF32, DType::kF32},   {DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF16},
    {DType::kE4M3, DType::kE4M3}, {DType::kE4M3, DType::kE5M2}, {DType::kE5M2, DType::kE4M3},
    {DType::kE5M2, DType::kE5M2},
};

// Three pairs that exercise every packing decoder (F32, BF16 and both FP8 formats).
const Pairs kSomePairs = {
    {DType::kF32, DType::kF32}, {DType::kBF16, DType::kBF16}, {DType::kE4M3, DType::kE5M2}};

// Each operand pair, both outputs, every transpose, with and without alpha and beta.
void run_all(const std::vector<Dims>& shapes, int64_t batch, uint32_t& seed,
             const Pairs& pairs = kOperandPairs) {
  for (const auto& pair : pairs) {
    for (DType out : {DType::kF32, DType::kBF16}) {
      for (const Dims& d : shapes) {
        for (int trans = 0; trans < 4; ++trans) {
          Case cs{pair.first,       pair.second,      out,  batch, d.m, d.n, d.k,
                  (trans & 1) != 0, (trans & 2) != 0, 1.0f, 0.0f};
          run_case(cs, seed++);
          cs.alpha = -0.75f;
          cs.beta = 1.5f;
          run_case(cs, seed++);
        }
      }
    }
  }
}

// Tile edges (M not a multiple of 6, N not of 16), K = 1, and whole tiles.
TEST(CpuGemmAvx2, SmallShapesAreBitIdenticalToTheScalarFp32Sum) {
  uint32_t seed = 1;
  run_all({{1, 1, 1}, {1, 17, 1}, {7, 19, 1}, {5, 3, 2}, {6, 16, 8}, {13, 33, 19}}, 1, seed);
}

// K past one packed block (256) and not a multiple of it, with partial sums kept in C or,
// when beta != 0 or C is BF16, in scratch; rows past one A block (144); columns past one B
// block (4 MiB of packed B over K = 1800: 576 columns); enough work to run on two threads,
// sharing blocks of rows (600 rows; 301 rows of too few columns to slice) or, when the blocks
// of rows would be small, each a slice of the columns.
TEST(CpuGemmAvx2, LargeShapesCrossEveryBlockAndThreadSlice) {
  uint32_t seed = 1000;
  run_all(
      {{13, 37, 600}, {150, 40, 30}, {130, 90, 300}, {301, 50, 140}, {600, 70, 40}, {40, 300, 257}},
      1, seed);
  run_all({{7, 600, 1800}}, 1, seed, kSomePairs);
}

// Three products share the threads one at a time; four go to the two threads whole.
TEST(CpuGemmAvx2, BatchedProductsAreEachTheirOwnSum) {
  uint32_t seed = 2000;
  run_all({{5, 7, 9}, {70, 33, 270}}, 3, seed);
  run_all({{70, 33, 270}}, 4, seed, kSomePairs);
}

// alpha = 0 or K = 0: C = beta * C (0 when beta = 0), and A and B are not read, so a NaN
// there does not reach C.
TEST(CpuGemmAvx2, AlphaZeroOrEmptyKLeavesBetaTimesC) {
  for (const Dims d : {Dims{4, 5, 3}, Dims{4, 5, 0}}) {
    for (float beta : {0.0f, 0.5f}) {
      SCOPED_TRACE("k " + std::to_string(d.k) + " beta " + std::to_string(beta));
      Tensor a = Tensor::empty({d.m, d.k}, DType::kBF16);
      Tensor b = Tensor::empty({d.k, d.n}, DType::kBF16);
      poison(a);
      poison(b);
      Tensor c = Tensor::empty({d.m, d.n}, DType::kBF16);
      for (int64_t i = 0; i < c.numel(); ++i) set_value(c, i, static_cast<float>(i) - 3.0f);
      if (beta == 0.0f) poison(c);
      const float alpha = d.k == 0 ? 2.0f : 0.0f;
      gemm_avx2(GemmShape{1, d.m, d.n, d.k}, a, false, b, false, alpha, beta, c.data(),
                DType::kBF16);
      for (int64_t i = 0; i < c.numel(); ++i) {
        EXPECT_EQ(value_at(c, i), beta * (static_cast<double>(i) - 3.0)) << "C[" << i << "]";
      }
    }
  }
}

TEST(CpuGemmAvx2, RefusesPairsItDoesNotTake) {
  const Tensor a = Tensor::empty({2, 2}, DType::kBF16);
  const Tensor b = Tensor::empty({2, 2}, DType::kF16);
  const Tensor c = Tensor::empty({2, 2}, DType::kF32);
  expect_error(
      [&] {
        gemm_avx2(GemmShape{1, 2, 2, 2}, a, false, b, false, 1, 0, c.data(), DType::kF32);
      },
      {"gemm_avx2", "bf16[2, 2]", "f16[2, 2]"});
  expect_error(
      [&] {
        gemm_avx2(GemmShape{1, 2, 2, 2}, a, false, a, false, 1, 0, c.data(), DType::kF16);
      },
      {"gemm_avx2", "f16"});
}

}  // namespace
}  // namespace mantissa::core
