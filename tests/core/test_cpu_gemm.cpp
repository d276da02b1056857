// CpuBackend::gemm against an FP64 reference.
//
// The reference decodes every stored operand code with the scalar functions of dtype.h (the
// definition of what a code means), multiplies and sums in double, and applies alpha, the
// dequantize scales and beta in double. Outputs are poisoned with NaN before each call, so an
// element the GEMM forgot to write fails the comparison.
//
// Two checks per element:
//  - a bound that holds for any FP32 summation order: |err| <= gamma(n) * sum_k |alpha a b|
//    (+ |beta c|), gamma(n) = n u / (1 - n u), u = 2^-24, with n = 2K + 8 covering the K
//    products and additions plus the roundings OpenBLAS adds when it splits K into blocks
//    and applies alpha and beta per block; then the one rounding into the output dtype
//    (half an ulp: 2^-8 relative for BF16, 2^-(mantissa bits + 1) for FP8, after clamping to
//    the largest finite value, plus half the smallest subnormal);
//  - the normwise error max |err| / max |ref| against a threshold per output dtype: 1e-5 for
//    F32, 1e-2 for BF16, 6e-2 for E4M3 and 0.125 for E5M2 (two mantissa bits: its half ulp
//    is 2^-3 relative, no rounding can do better).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/int_math.h"
#include "core/ops/backend.h"
#include "core/ops/cpu/cpu_gemm_amx.h"
#include "core/ops/cpu/cpu_gemm_bf16.h"
#include "core/ops/cpu_switches.h"
#include "core/tensor/tensor.h"
#include "tests/common/test_util.h"

namespace mantissa::core {
namespace {

// Largest finite value and smallest subnormal of each FP8 output format, for the rounding
// bounds (test_util.h's grid_of() gives the mantissa bits).
double max_finite(DType d) {
  return d == DType::kE4M3 ? 448.0 : 57344.0;
}
double min_subnormal(DType d) {
  return d == DType::kE4M3 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -16);
}

double normwise_tolerance(DType c) {
  switch (c) {
    case DType::kF32: return 1e-5;
    case DType::kBF16: return 1e-2;
    case DType::kF16: return 1e-3;
    case DType::kE4M3: return 6e-2;
    default: return 0.125;
  }
}

// Operand values spread over many binades (uniform times 2^-e), so FP8 subnormals and
// zeros show up too. FP8 codes span most of the format's range; the dequantize scale maps
// them back to O(1) values.
Tensor random_operand(const Shape& shape, DType dtype, std::mt19937& rng) {
  const float range = dtype == DType::kE4M3 ? 300.0f : dtype == DType::kE5M2 ? 3000.0f : 1.0f;
  const int max_shift = is_fp8(dtype) ? 12 : 8;
  std::uniform_real_distribution<float> uniform(-range, range);
  std::uniform_int_distribution<int> shift(0, max_shift);
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) set_value(t, i, std::ldexp(uniform(rng), -shift(rng)));
  return t;
}

struct Case {
  DType a = DType::kF32;
  DType b = DType::kF32;
  DType c = DType::kF32;
  int64_t batch = 0;  // 0: plain 2-D operands
  int64_t m = 1;
  int64_t n = 1;
  int64_t k = 1;
  bool trans_a = false;
  bool trans_b = false;
  float alpha = 1.0f;
  float beta = 0.0f;
  bool scales = false;  // FP8 operands: pass a_scale and b_scale (else they default to 1)
  float c_range = 200;  // FP8 output: c_scale maps max |ref| to this many units
};

std::string describe(const Case& cs) {
  std::ostringstream out;
  out << dtype_name(cs.a) << " x " << dtype_name(cs.b) << " -> " << dtype_name(cs.c) << " batch "
      << cs.batch << " m " << cs.m << " n " << cs.n << " k " << cs.k << " trans " << cs.trans_a
      << cs.trans_b << " alpha " << cs.alpha << " beta " << cs.beta << " scales " << cs.scales;
  return out.str();
}

Shape operand_shape(int64_t batch, int64_t rows, int64_t cols) {
  return batch > 0 ? Shape{batch, rows, cols} : Shape{rows, cols};
}

void run_case(const Case& cs, uint32_t seed) {
  SCOPED_TRACE(describe(cs));
  std::mt19937 rng(seed);
  const int64_t batches = std::max<int64_t>(cs.batch, 1);
  const Tensor a = random_operand(
      cs.trans_a ? operand_shape(cs.batch, cs.k, cs.m) : operand_shape(cs.batch, cs.m, cs.k), cs.a,
      rng);
  const Tensor b = random_operand(
      cs.trans_b ? operand_shape(cs.batch, cs.n, cs.k) : operand_shape(cs.batch, cs.k, cs.n), cs.b,
      rng);
  Tensor c = Tensor::empty(operand_shape(cs.batch, cs.m, cs.n), cs.c);
  if (cs.beta != 0.0f) {
    std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
    for (int64_t i = 0; i < c.numel(); ++i) set_value(c, i, uniform(rng));
  } else {
    poison(c);
  }

  const bool fp8_in = is_fp8(cs.a);
  const float a_scale_value = cs.a == DType::kE4M3 ? 0.00457f : 0.000391f;
  const float b_scale_value = cs.b == DType::kE4M3 ? 0.00293f : 0.000317f;
  const Tensor a_scale = f32_scalar(a_scale_value);
  const Tensor b_scale = f32_scalar(b_scale_value);
  const double sa = cs.scales ? a_scale_value : 1.0;
  const double sb = cs.scales ? b_scale_value : 1.0;

  // FP64 reference and the per-element accumulation bound.
  const int64_t m = cs.m, n = cs.n, k = cs.k;
  const int64_t elements = batches * m * n;
  std::vector<double> ref(elements), acc_bound(elements);
  const double u = std::ldexp(1.0, -24);
  const double gamma = (2 * k + 8) * u / (1 - (2 * k + 8) * u);
  double ref_amax = 0;
  std::vector<double> op_a(m * k), op_b_t(n * k);  // op(A) and op(B)^T of one batch, decoded
  for (int64_t p = 0; p < batches; ++p) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t l = 0; l < k; ++l) {
        op_a[i * k + l] = value_at(a, p * m * k + (cs.trans_a ? l * m + i : i * k + l));
      }
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t l = 0; l < k; ++l) {
        op_b_t[j * k + l] = value_at(b, p * k * n + (cs.trans_b ? j * k + l : l * n + j));
      }
    }
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0, abs_sum = 0;
        for (int64_t l = 0; l < k; ++l) {
          const double product = op_a[i * k + l] * op_b_t[j * k + l];
          sum += product;
          abs_sum += std::fabs(product);
        }
        const int64_t e = (p * m + i) * n + j;
        const double c0 = cs.beta != 0.0f ? value_at(c, e) : 0.0;
        const double scale = cs.alpha * sa * sb;
        ref[e] = scale * sum + cs.beta * c0;
        acc_bound[e] = gamma * (std::fabs(scale) * abs_sum + std::fabs(cs.beta * c0));
        ref_amax = std::max(ref_amax, std::fabs(ref[e]));
      }
    }
  }

  GemmParams params;
  params.trans_a = cs.trans_a;
  params.trans_b = cs.trans_b;
  params.alpha = cs.alpha;
  params.beta = cs.beta;
  if (cs.scales && fp8_in) {
    params.a_scale = &a_scale;
    params.b_scale = &b_scale;
  }
  const bool fp8_out = is_fp8(cs.c);
  const float c_scale_value =
      fp8_out && ref_amax > 0 ? static_cast<float>(cs.c_range / ref_amax) : 1.0f;
  const Tensor c_scale = f32_scalar(c_scale_value);
  Tensor c_amax = f32_scalar(NAN);
  if (fp8_out) {
    params.c_scale = &c_scale;
    params.c_amax = &c_amax;
  }
  make_cpu_backend()->gemm(a, b, c, params);

  // Compare in the value domain (FP8 codes divided by c_scale), against the reference
  // clamped to the output's finite range the way SATFINITE clamps.
  const double cs_d = c_scale_value;
  const double out_ulp = std::ldexp(1.0, -(grid_of(cs.c).man_bits + 1));
  double max_err = 0, max_ref = 0;
  int failures = 0;
  for (int64_t e = 0; e < elements; ++e) {
    double expected = ref[e], got = value_at(c, e), bound = acc_bound[e];
    if (fp8_out) {
      const double x = std::clamp(ref[e] * cs_d, -max_finite(cs.c), max_finite(cs.c));
      const double x_bound = acc_bound[e] * cs_d;
      expected = x / cs_d;
      got /= cs_d;
      bound = (x_bound + out_ulp * (std::fabs(x) + x_bound) + u * std::fabs(ref[e] * cs_d) +
               min_subnormal(cs.c) / 2) /
              cs_d;
    } else if (cs.c == DType::kBF16) {
      bound += out_ulp * (std::fabs(expected) + bound);
    } else if (cs.c == DType::kF16) {
      // One rounding, relative in the normal range, half a subnormal (2^-25) below it.
      bound += out_ulp * (std::fabs(expected) + bound) + std::ldexp(1.0, -25);
    }
    const double err = std::fabs(got - expected);
    if (!(err <= bound) && failures++ < 5) {
      ADD_FAILURE() << "element " << e << ": got " << got << ", expected " << expected << " (bound "
                    << bound << ")";
    }
    max_err = worse_error(max_err, err);
    max_ref = std::max(max_ref, std::fabs(expected));
  }
  EXPECT_EQ(failures, 0);
  // F16 results that small fall among its subnormals, whose spacing is absolute.
  const double absolute = cs.c == DType::kF16 ? std::ldexp(1.0, -25) : 0.0;
  EXPECT_LE(max_err, normwise_tolerance(cs.c) * max_ref + absolute) << "max |ref| " << max_ref;
  if (fp8_out) {
    const double max_acc = elements ? *std::max_element(acc_bound.begin(), acc_bound.end()) : 0;
    EXPECT_NEAR(value_at(c_amax, 0), ref_amax, max_acc + u * ref_amax) << "c_amax";
  }
}

struct DTypes {
  DType a, b, c;
};

// Every supported operand pairing with every output it can produce (gemm_checks.h).
const std::vector<DTypes> kDTypes = {
    {DType::kF32, DType::kF32, DType::kF32},    {DType::kBF16, DType::kBF16, DType::kF32},
    {DType::kBF16, DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF16, DType::kF32},
    {DType::kF16, DType::kF16, DType::kF16},    {DType::kE4M3, DType::kE4M3, DType::kF32},
    {DType::kE4M3, DType::kE4M3, DType::kBF16}, {DType::kE4M3, DType::kE4M3, DType::kE4M3},
    {DType::kE4M3, DType::kE5M2, DType::kF32},  {DType::kE4M3, DType::kE5M2, DType::kE5M2},
    {DType::kE5M2, DType::kE4M3, DType::kBF16}, {DType::kE5M2, DType::kE4M3, DType::kE4M3},
};

struct Dims {
  int64_t m, n, k;
};

// Calls body(cs, trans) with the case of every dtype triple, shape (with `batch`) and
// transpose combination (trans: bit 0 transposes A, bit 1 B). FP8 GEMMs need K and the
// rows of C in whole 16 bytes (gemm_checks.h), so their K and N are rounded up to that.
template <class Body>
void for_each_case(const std::vector<DTypes>& dtypes, const std::vector<Dims>& shapes,
                   int64_t batch, const Body& body) {
  for (const DTypes& d : dtypes) {
    for (Dims s : shapes) {
      if (is_fp8(d.a)) {
        s.k = round_up(s.k, 16);
        s.n = round_up(s.n, 16 / static_cast<int64_t>(dtype_size(d.c)));
      }
      for (int trans = 0; trans < 4; ++trans) {
        Case cs{.a = d.a, .b = d.b, .c = d.c, .batch = batch, .m = s.m, .n = s.n, .k = s.k};
        cs.trans_a = trans & 1;
        cs.trans_b = trans & 2;
        body(cs, trans);
      }
    }
  }
}

TEST(CpuGemm, MatchesFp64ReferenceForAllDtypesShapesAndTransposes) {
  // Odd sizes (OpenBLAS kernel edges), degenerate ones (K = 0 leaves beta * C, M = 0 is
  // empty) and larger products that are sliced across threads (by rows of C, or by columns
  // when C has few rows) and that OpenBLAS splits into K blocks.
  const std::vector<Dims> shapes = {{1, 1, 1},     {3, 17, 5},    {17, 3, 65},   {65, 33, 17},
                                    {1, 31, 257},  {33, 1, 64},   {3, 4, 0},     {0, 5, 3},
                                    {64, 96, 384}, {96, 64, 384}, {20, 256, 300}};
  uint32_t seed = 1;
  for_each_case(kDTypes, shapes, 0, [&](Case cs, int trans) {
    cs.scales = is_fp8(cs.a) && trans % 2 == 0;
    run_case(cs, seed++);
    // alpha and beta (beta only where the output can be accumulated into).
    cs.alpha = -0.75f;
    cs.beta = is_fp8(cs.c) ? 0.0f : 1.5f;
    run_case(cs, seed++);
  });
}

// Small batches run one after another; the largest is sliced across threads.
TEST(CpuGemm, StridedBatchedMatchesPerBatchReference) {
  const std::vector<DTypes> dtypes = {{DType::kF32, DType::kF32, DType::kF32},
                                      {DType::kBF16, DType::kBF16, DType::kBF16},
                                      {DType::kE4M3, DType::kE5M2, DType::kE4M3}};
  const std::vector<Dims> shapes = {{5, 7, 9}, {17, 33, 65}, {64, 48, 256}};
  uint32_t seed = 1000;
  for_each_case(dtypes, shapes, 3, [&](Case cs, int) {
    cs.scales = is_fp8(cs.a);
    cs.alpha = 0.5f;
    cs.beta = is_fp8(cs.c) ? 0.0f : -1.0f;
    run_case(cs, seed++);
  });
}

// Shapes past the native BF16 kernel's small cases (cpu_gemm_bf16.cpp): many column blocks
// with a partial last panel, and a C too short to split by rows, which is split by columns
// across the threads instead.
TEST(CpuGemm, LargeShapesCrossPanelBlocksAndColumnSplits) {
  const std::vector<DTypes> dtypes = {{DType::kBF16, DType::kBF16, DType::kF32},
                                      {DType::kE4M3, DType::kE5M2, DType::kBF16}};
  const std::vector<Dims> shapes = {{12, 400, 1500}, {30, 700, 1030}};
  uint32_t seed = 2000;
  for_each_case(dtypes, shapes, 0, [&](Case cs, int trans) {
    cs.scales = is_fp8(cs.a);
    cs.beta = trans == 3 ? 0.5f : 0.0f;
    run_case(cs, seed++);
  });
}

// ctest runs this file three times: as it is, with MANTISSA_CPU_BF16_GEMM=0, so that the
// AVX2/FMA kernel that CPUs without AVX512-BF16 run BF16 and FP8 operands on is tested here
// too (F16 operands run it on every CPU), and with MANTISSA_CPU_AMX=0, so that on a CPU with
// AMX the VDPBF16PS kernel is too.
TEST(CpuGemm, NativeBf16KernelFollowsCpuAndEnvironment) {
  const auto off = [](const char* variable) {
    const char* setting = std::getenv(variable);
    return setting != nullptr && std::string(setting) == "0";
  };
  const bool cpu_has = __builtin_cpu_supports("avx512bf16") != 0;
  EXPECT_EQ(bf16_gemm_enabled(), cpu_has && !off("MANTISSA_CPU_BF16_GEMM"));
  if (off("MANTISSA_CPU_AMX")) {
    EXPECT_FALSE(amx::enabled());
  }
  std::printf("BF16 and FP8 operands: %s\n", cpu_paths_description().c_str());
}

// What tells the two paths apart: VDPBF16PS reads a BF16 subnormal as zero, the AVX2 kernel
// on the widened value does not. 2^-130 (a BF16 subnormal) times 2^100 is 2^-30 or, natively, 0.
TEST(CpuGemm, Bf16SubnormalOperandIsZeroExactlyWhenTheNativeKernelRuns) {
  Tensor a = Tensor::empty(Shape{1, 2}, DType::kBF16);
  Tensor b = Tensor::empty(Shape{2, 1}, DType::kBF16);
  Tensor c = Tensor::empty(Shape{1, 1}, DType::kF32);
  set_value(a, 0, std::ldexp(1.0f, -130));
  set_value(a, 1, 0.0f);
  set_value(b, 0, std::ldexp(1.0f, 100));
  set_value(b, 1, 0.0f);
  ASSERT_EQ(value_at(a, 0), std::ldexp(1.0, -130)) << "2^-130 must be exact in BF16";
  make_cpu_backend()->gemm(a, b, c, GemmParams{});
  EXPECT_EQ(value_at(c, 0), bf16_gemm_enabled() ? 0.0 : std::ldexp(1.0, -30));
}

// A BF16 C is the FP32 result rounded once to nearest even: the kernels round as they store,
// with no FP32 pass in between, and must give exactly bf16_from_float of the F32 output of the
// same call (beta reading the same BF16 values).
TEST(CpuGemm, Bf16OutputIsTheF32OutputRoundedOnce) {
  const std::vector<DTypes> pairs = {{DType::kBF16, DType::kBF16, DType::kBF16},
                                     {DType::kE4M3, DType::kE5M2, DType::kBF16}};
  const std::vector<Dims> shapes = {{7, 32, 48}, {33, 48, 64}, {130, 80, 320}};
  std::mt19937 rng(11);
  auto backend = make_cpu_backend();
  for (int64_t batch : {0, 2}) {
    for_each_case(pairs, shapes, batch, [&](Case cs, int trans) {
      for (float beta : {0.0f, 0.5f}) {
        SCOPED_TRACE(describe(cs) + " beta " + std::to_string(beta) + " trans " +
                     std::to_string(trans));
        const int64_t batches = std::max<int64_t>(batch, 1);
        const Tensor a = random_operand(
            cs.trans_a ? operand_shape(batch, cs.k, cs.m) : operand_shape(batch, cs.m, cs.k), cs.a,
            rng);
        const Tensor b = random_operand(
            cs.trans_b ? operand_shape(batch, cs.n, cs.k) : operand_shape(batch, cs.k, cs.n), cs.b,
            rng);
        Tensor c16 = Tensor::empty(operand_shape(batch, cs.m, cs.n), DType::kBF16);
        Tensor c32 = Tensor::empty(c16.shape(), DType::kF32);
        std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
        for (int64_t i = 0; i < c16.numel(); ++i) {
          set_value(c16, i, uniform(rng));
          set_value(c32, i, static_cast<float>(value_at(c16, i)));
        }
        GemmParams params;
        params.trans_a = cs.trans_a;
        params.trans_b = cs.trans_b;
        params.alpha = -0.75f;
        params.beta = beta;
        backend->gemm(a, b, c32, params);
        backend->gemm(a, b, c16, params);
        int failures = 0;
        for (int64_t e = 0; e < batches * cs.m * cs.n; ++e) {
          const uint16_t expected = bf16_from_float(static_cast<float>(value_at(c32, e))).bits;
          if (code_at(c16, e) != expected && failures++ < 5) {
            ADD_FAILURE() << "element " << e << ": BF16 code " << code_at(c16, e)
                          << ", the F32 result " << value_at(c32, e) << " rounds to " << expected;
          }
        }
      }
    });
  }
}

// Every finite FP8 code through each of the kernels' four operand packers (A or B, stored or
// transposed): C = D I and C = I D with D = diag(codes) (a diagonal matrix is its own
// transpose, so only the packing path changes) must give each code's value exactly on the
// diagonal and +-0 elsewhere: each element has one non-zero product, exact in FP32.
TEST(CpuGemm, EveryFiniteFp8CodeIsDecodedExactlyByEveryPacker) {
  constexpr int64_t n = 256;
  for (DType type : {DType::kE4M3, DType::kE5M2}) {
    Tensor diagonal = Tensor::empty(Shape{n, n}, type);
    Tensor identity = Tensor::empty(Shape{n, n}, DType::kE4M3);  // no GEMM takes E5M2 x E5M2
    std::memset(diagonal.data(), 0, diagonal.nbytes());          // code 0 is +0 in both FP8 formats
    std::memset(identity.data(), 0, identity.nbytes());
    std::vector<double> expected(n, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      set_code(identity, i * n + i, encode(DType::kE4M3, 1.0f));
      if (!std::isfinite(decode(type, static_cast<uint32_t>(i)))) continue;
      set_code(diagonal, i * n + i, static_cast<uint64_t>(i));
      expected[i] = decode(type, static_cast<uint32_t>(i));
    }
    for (int trans = 0; trans < 4; ++trans) {
      for (bool diagonal_first : {true, false}) {
        GemmParams params;
        params.trans_a = trans & 1;
        params.trans_b = trans & 2;
        Tensor c = Tensor::empty(Shape{n, n}, DType::kF32);
        poison(c);
        make_cpu_backend()->gemm(diagonal_first ? diagonal : identity,
                                 diagonal_first ? identity : diagonal, c, params);
        int failures = 0;
        for (int64_t e = 0; e < n * n && failures < 5; ++e) {
          const double want = e / n == e % n ? expected[e / n] : 0.0;
          if (value_at(c, e) != want) {
            ++failures;
            ADD_FAILURE() << dtype_name(type) << (diagonal_first ? " D I" : " I D") << " trans "
                          << trans << ": C[" << e / n << ", " << e % n << "] = " << value_at(c, e)
                          << ", expected " << want;
          }
        }
      }
    }
  }
}

TEST(CpuGemm, Fp8OutputSaturatesToLargestFinite) {
  // c_scale maps max |ref| to 1000 > 448: the largest results must clamp to +-448, not NaN.
  Case cs{.a = DType::kE4M3, .b = DType::kE4M3, .c = DType::kE4M3, .m = 33, .n = 48, .k = 48};
  cs.scales = true;
  cs.c_range = 1000.0f;
  run_case(cs, 7);
  cs.b = DType::kE5M2;  // an E5M2 output needs an E5M2 operand
  cs.c = DType::kE5M2;
  cs.c_range = 1e6f;  // past 57344
  run_case(cs, 8);
}

// --- non-finite values ---------------------------------------------------------------------

// A NaN at op(A)[i0, k0] must turn the whole row i0 of C into NaN (NaN * anything, zero
// included, is NaN) and leave the other rows finite.
TEST(CpuGemm, NanInAnOperandPropagatesToItsRowOrColumn) {
  const std::vector<DTypes> dtypes = {{DType::kF32, DType::kF32, DType::kF32},
                                      {DType::kBF16, DType::kBF16, DType::kBF16},
                                      {DType::kF16, DType::kF16, DType::kF32},
                                      {DType::kE4M3, DType::kE4M3, DType::kE4M3},
                                      {DType::kE5M2, DType::kE4M3, DType::kBF16}};
  const int64_t m = 9, i0 = 4, j0 = 2, l0 = 6;
  std::mt19937 rng(42);
  for (const DTypes& d : dtypes) {
    // FP8 GEMMs need K and the rows of C in whole 16 bytes.
    const int64_t n = is_fp8(d.a) ? 16 : 7, k = is_fp8(d.a) ? 16 : 13;
    for (int trans = 0; trans < 4; ++trans) {
      for (bool in_a : {true, false}) {
        SCOPED_TRACE(std::string(dtype_name(d.a)) + " x " + dtype_name(d.b) + " -> " +
                     dtype_name(d.c) + " trans " + std::to_string(trans) +
                     (in_a ? " NaN in A" : " NaN in B"));
        const bool ta = trans & 1, tb = trans & 2;
        Tensor a = random_operand(ta ? Shape{k, m} : Shape{m, k}, d.a, rng);
        Tensor b = random_operand(tb ? Shape{n, k} : Shape{k, n}, d.b, rng);
        if (in_a) {
          set_value(a, ta ? l0 * m + i0 : i0 * k + l0, NAN);
        } else {
          set_value(b, tb ? j0 * k + l0 : l0 * n + j0, NAN);
        }
        Tensor c = Tensor::empty({m, n}, d.c);
        poison(c);
        const Tensor c_scale = f32_scalar(0.5f);
        Tensor c_amax = f32_scalar(0.0f);
        GemmParams params;
        params.trans_a = ta;
        params.trans_b = tb;
        if (is_fp8(d.c)) {
          params.c_scale = &c_scale;
          params.c_amax = &c_amax;
        }
        make_cpu_backend()->gemm(a, b, c, params);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const bool hit = in_a ? i == i0 : j == j0;
            EXPECT_EQ(std::isnan(value_at(c, i * n + j)), hit) << "C[" << i << ", " << j << "]";
          }
        }
        if (is_fp8(d.c)) {
          EXPECT_TRUE(std::isnan(value_at(c_amax, 0))) << "c_amax must report the NaN";
        }
      }
    }
  }
}

// With beta != 0 a NaN in the old C reaches the new C; with beta = 0 the old C is not read,
// so NaN there (the poison every other test uses) never leaks.
TEST(CpuGemm, NanInCPropagatesOnlyWhenBetaReadsIt) {
  std::mt19937 rng(3);
  for (DType out : {DType::kF32, DType::kBF16}) {
    for (float beta : {0.0f, 0.25f}) {
      SCOPED_TRACE(std::string(dtype_name(out)) + " beta " + std::to_string(beta));
      const Tensor a = random_operand({5, 6}, DType::kBF16, rng);
      const Tensor b = random_operand({6, 4}, DType::kBF16, rng);
      Tensor c = Tensor::empty({5, 4}, out);
      for (int64_t i = 0; i < c.numel(); ++i) set_value(c, i, 1.0f);
      set_value(c, 9, NAN);
      GemmParams params;
      params.beta = beta;
      make_cpu_backend()->gemm(a, b, c, params);
      for (int64_t i = 0; i < c.numel(); ++i) {
        EXPECT_EQ(std::isnan(value_at(c, i)), beta != 0.0f && i == 9) << "C[" << i << "]";
      }
    }
  }
}

// alpha = 0 does not read A and B (backend.h): C = beta * C, whatever NaN or inf they hold, at
// every thread count. The shape is one that OpenBLAS's sgemm reads A for on 2 threads.
TEST(CpuGemm, AlphaZeroReadsNeitherOperand) {
  std::mt19937 rng(5);
  const int64_t m = 64, n = 97, k = 255;
  const int threads = omp_get_max_threads();
  for (DType d : {DType::kF32, DType::kBF16}) {
    for (float beta : {0.0f, -0.5f}) {
      for (int t : {1, 2}) {
        SCOPED_TRACE(std::string(dtype_name(d)) + " beta " + std::to_string(beta) + " threads " +
                     std::to_string(t));
        Tensor a = random_operand({k, m}, d, rng);
        Tensor b = random_operand({n, k}, d, rng);
        set_value(a, 3 * m + 7, NAN);
        set_value(b, 5 * k + 11, INFINITY);
        Tensor c = Tensor::empty({m, n}, DType::kF32);
        for (int64_t i = 0; i < c.numel(); ++i) set_value(c, i, static_cast<float>(i % 13) - 6);
        GemmParams params;
        params.trans_a = true;
        params.trans_b = true;
        params.alpha = 0.0f;
        params.beta = beta;
        omp_set_num_threads(t);
        make_cpu_backend()->gemm(a, b, c, params);
        omp_set_num_threads(threads);
        for (int64_t i = 0; i < c.numel(); ++i) {
          ASSERT_EQ(value_at(c, i), beta * static_cast<float>(i % 13 - 6)) << "C[" << i << "]";
        }
      }
    }
  }
}

// --- argument validation -------------------------------------------------------------------

// The call must throw core::Error whose message names the op and the offending operand with
// its dtype and shape (e.g. "A e5m2[4, 8] on cpu"), and must not write to C.
void expect_gemm_error(const std::function<void()>& call, const std::string& operand) {
  SCOPED_TRACE("expected an error naming " + operand);
  try {
    call();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("gemm"), std::string::npos) << message;
    EXPECT_NE(message.find(operand), std::string::npos) << message;
  }
}

void expect_no_gemm_error(const std::function<void()>& call) {
  try {
    call();
  } catch (const Error& e) {
    ADD_FAILURE() << "unexpected error: " << e.what();
  }
}

TEST(CpuGemm, RejectsBadArgumentsNamingTheOperand) {
  auto backend = make_cpu_backend();
  std::mt19937 rng(5);
  const auto t = [&](DType dtype, Shape shape) { return random_operand(shape, dtype, rng); };
  const auto run = [&](const Tensor& a, const Tensor& b, Tensor c, GemmParams p = {}) {
    return [&backend, a, b, c, p]() mutable { backend->gemm(a, b, c, p); };
  };
  const auto name = [](const char* operand, const Tensor& x) {
    return std::string(operand) + " " + x.describe();
  };
  const Tensor a = t(DType::kF32, {4, 8});
  const Tensor b = t(DType::kF32, {8, 3});
  const Tensor c = Tensor::empty({4, 3}, DType::kF32);

  // Shapes.
  const Tensor b_bad = t(DType::kF32, {7, 3});
  expect_gemm_error(run(a, b_bad, c), name("B", b_bad));
  expect_gemm_error(run(a, b_bad, c), name("A", a));
  GemmParams transposed;
  transposed.trans_b = true;  // B^T would need B as [3, 8]
  expect_gemm_error(run(a, b, c, transposed), name("B", b));
  const Tensor c_bad = Tensor::empty({4, 4}, DType::kF32);
  expect_gemm_error(run(a, b, c_bad), name("C", c_bad));
  const Tensor a_1d = t(DType::kF32, {8});
  expect_gemm_error(run(a_1d, b, c), name("A", a_1d));
  const Tensor a_3d = t(DType::kF32, {2, 4, 8});
  expect_gemm_error(run(a_3d, b, c), name("B", b));
  const Tensor b_3d = t(DType::kF32, {3, 8, 3});
  const Tensor c_3d = Tensor::empty({2, 4, 3}, DType::kF32);
  expect_gemm_error(run(a_3d, b_3d, c_3d), name("B", b_3d));
  const Tensor c_alias = a.view(0, {4, 3});
  expect_gemm_error(run(a, b, c_alias), name("C", c_alias));

  // Dtype combinations.
  const Tensor a_e5 = t(DType::kE5M2, {4, 8});
  const Tensor b_e5 = t(DType::kE5M2, {8, 3});
  const Tensor a_e4 = t(DType::kE4M3, {4, 8});
  const Tensor b_e4 = t(DType::kE4M3, {8, 3});
  const Tensor b_bf = t(DType::kBF16, {8, 3});
  const Tensor b_f16 = t(DType::kF16, {8, 3});
  const Tensor a_bf = t(DType::kBF16, {4, 8});
  expect_gemm_error(run(a_e5, b_e5, c), name("A", a_e5));
  expect_gemm_error(run(a_e5, b_e5, c), name("B", b_e5));
  expect_gemm_error(run(a_e4, b_bf, c), name("B", b_bf));
  expect_gemm_error(run(a_bf, b_e4, c), name("A", a_bf));
  expect_gemm_error(run(a_bf, b_f16, c), name("B", b_f16));
  // Outputs outside the type table of gemm_checks.h.
  const Tensor c_f16 = Tensor::empty({4, 3}, DType::kF16);
  expect_gemm_error(run(a, b, c_f16), name("C", c_f16));
  const Tensor c_bf = Tensor::empty({4, 3}, DType::kBF16);
  expect_gemm_error(run(a, b, c_bf), name("C", c_bf));
  expect_gemm_error(run(a_e4, b_e4, c_f16), name("C", c_f16));
  const Tensor c_e5 = Tensor::empty({4, 3}, DType::kE5M2);
  expect_gemm_error(run(a_e4, b_e4, c_e5), name("C", c_e5));
  const Tensor a_i32 = Tensor::empty({4, 8}, DType::kI32);
  expect_gemm_error(run(a_i32, b, c), name("A", a_i32));
  const Tensor c_e4 = Tensor::empty({4, 3}, DType::kE4M3);
  expect_gemm_error(run(a_bf, b_bf, c_e4), name("C", c_e4));
  GemmParams accumulate;
  accumulate.beta = 1.0f;
  expect_gemm_error(run(a_e4, b_e4, c_e4, accumulate), name("C", c_e4));
  // FP8 rows of 16 bytes: K (8 here) and C's rows (3 FP32 = 12 bytes), as on a GPU.
  expect_gemm_error(run(a_e4, b_e4, c), name("A", a_e4));
  expect_gemm_error(run(a_e4, b_e4, c), name("B", b_e4));
  const Tensor a_e4_k16 = t(DType::kE4M3, {4, 16});
  const Tensor b_e4_k16 = t(DType::kE4M3, {16, 3});
  expect_gemm_error(run(a_e4_k16, b_e4_k16, c), name("C", c));
  expect_no_gemm_error(run(a_e4_k16, t(DType::kE4M3, {16, 4}), Tensor::empty({4, 4}, DType::kF32)));

  // Scale and amax scalars: 1-element F32 tensors, for FP8 tensors only.
  const Tensor two = Tensor::empty({2}, DType::kF32);
  const Tensor bf_scalar = Tensor::empty({1}, DType::kBF16);
  const Tensor one = f32_scalar(1.0f);
  GemmParams p;
  p.a_scale = &two;
  expect_gemm_error(run(a_e4, b_e4, c, p), name("a_scale", two));
  p = {};
  p.b_scale = &bf_scalar;
  expect_gemm_error(run(a_e4, b_e4, c, p), name("b_scale", bf_scalar));
  p = {};
  p.a_scale = &one;
  expect_gemm_error(run(a, b, c, p), name("a_scale", one));
  p = {};
  p.c_scale = &one;
  expect_gemm_error(run(a_e4, b_e4, c, p), name("c_scale", one));
  Tensor amax_i64 = Tensor::empty({1}, DType::kI64);
  p = {};
  p.c_amax = &amax_i64;
  expect_gemm_error(run(a_e4, b_e4, c_e4, p), name("c_amax", amax_i64));

  // Device: tensors that claim to live on a GPU (never dereferenced).
  float storage[32] = {};
  const Tensor a_gpu = Tensor::wrap(storage, {4, 8}, DType::kF32, Device::cuda(0));
  const Tensor c_gpu = Tensor::wrap(storage, {4, 3}, DType::kF32, Device::cuda(0));
  const Tensor scale_gpu = Tensor::wrap(storage, {1}, DType::kF32, Device::cuda(0));
  expect_gemm_error(run(a_gpu, b, c), name("A", a_gpu));
  expect_gemm_error(run(a, b, c_gpu), name("C", c_gpu));
  p = {};
  p.b_scale = &scale_gpu;
  expect_gemm_error(run(a_e4, b_e4, c, p), name("b_scale", scale_gpu));
}

TEST(CpuGemm, RejectedCallLeavesOutputUntouched) {
  Tensor a = Tensor::empty({4, 8}, DType::kE5M2);
  Tensor b = Tensor::empty({8, 3}, DType::kE5M2);
  poison(a);
  poison(b);
  Tensor c = Tensor::empty({4, 3}, DType::kF32);
  for (int64_t i = 0; i < c.numel(); ++i) set_value(c, i, static_cast<float>(i));
  EXPECT_THROW(make_cpu_backend()->gemm(a, b, c, {}), Error);
  for (int64_t i = 0; i < c.numel(); ++i) EXPECT_EQ(value_at(c, i), static_cast<double>(i));
}

}  // namespace
}  // namespace mantissa::core
