// CPU GEMM throughput at the shapes of the reference GPT (d = 384, 4d = 1536, 3d = 1152,
// vocab 256, 2048 tokens per micro-batch), next to raw cblas_sgemm on the same shape and
// against the machine's FP32 FMA peak, measured by a small FMA-throughput loop in the same run
// (bench/fma_peak.h) on the same OpenMP threads.
//
// Each linear layer y[M, N] = x[M, K] W[N, K]^T runs three GEMMs per step:
//   forward       y  = x W^T         (M = tokens, B transposed)
//   backward dx   dx = dy W          (M = tokens, plain)
//   backward dW   dW = dy^T x        ([N, K] = [N, M] [M, K], A transposed)
// For every one, each operand dtype (F32, BF16, FP8 E4M3 x E4M3 with dequantize scales) and
// output dtype (F32, BF16) is timed next to the anchor: cblas_sgemm on F32 operands and
// output, with OpenBLAS's own threads (as many as it starts with). The backend's GEMM runs
// on the OpenMP threads instead and keeps OpenBLAS single-threaded, so the two take turns in
// blocks (each block starts with an untimed call that absorbs the hand-over between thread
// pools), three blocks of each in alternation, and every configuration is compared with the
// anchor blocks interleaved with its own, so slow drifts in machine load shift both alike.
// "peak" columns are GFLOP/s over the measured FMA peak (the native BF16 kernel can pass 1:
// one VDPBF16PS does twice the multiply-adds of an FP32 FMA, one AMX TDPBF16PS 8,192). BF16
// and FP8 operands run the native kernel (on AMX tiles or VDPBF16PS) where the CPU has one,
// else the AVX2/FMA kernel (the "CPU paths" line says which path ran); the last lines give, per
// operand dtype, the lowest and the geometric mean of its ratio to sgemm over the shapes. No
// time passes or fails; a product off its sgemm reference does (exit 1), so that a kernel that
// computes something else is not timed as a fast one.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_timing.h"
#include "bench/fma_peak.h"
#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/ops/backend.h"
#include "core/ops/cpu_switches.h"
#include "core/tensor/tensor.h"

using namespace mantissa::core;

namespace {

using mantissa::bench::median;

constexpr size_t kMinRepetitions = 5;

struct Problem {
  std::string name;
  int64_t m, n, k;
  bool trans_a, trans_b;
};

// Random values in [-1, 1] stored in `dtype`. FP8 codes are spread over [-256, 256] and
// carry a dequantize scale of 1/256, the way a per-tensor recipe scales them.
Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float x = uniform(rng);
    switch (dtype) {
      case DType::kF32: t.data_as<float>()[i] = x; break;
      case DType::kBF16: t.data_as<bf16>()[i] = round_to<bf16>(x); break;
      case DType::kE4M3: t.data_as<fp8_e4m3>()[i] = round_to<fp8_e4m3>(x * 256.0f); break;
      default: break;
    }
  }
  return t;
}

struct PairTiming {
  double anchor_seconds;
  double op_seconds;
};

// Median seconds per call of `anchor` and of `op`, timed in alternating blocks: kRounds
// blocks of each, every block one untimed call (it absorbs the hand-over between thread
// pools) and then timed calls filling min_seconds / kRounds (at least kMinRepetitions).
// A burst of load from another process then lands in one block of the several on each
// side instead of in the only block of one side.
PairTiming time_pair(const std::function<void()>& anchor, const std::function<void()>& op,
                     double min_seconds) {
  using Clock = std::chrono::steady_clock;
  constexpr int kRounds = 3;
  const auto time_block = [&](const std::function<void()>& call, std::vector<double>& seconds) {
    call();
    const Clock::time_point start = Clock::now();
    for (size_t n = 0;
         n < kMinRepetitions ||
         std::chrono::duration<double>(Clock::now() - start).count() < min_seconds / kRounds;
         ++n) {
      const Clock::time_point t0 = Clock::now();
      call();
      seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  };
  std::vector<double> anchor_seconds, op_seconds;
  for (int round = 0; round < kRounds; ++round) {
    time_block(anchor, anchor_seconds);
    time_block(op, op_seconds);
  }
  return {median(anchor_seconds), median(op_seconds)};
}

Shape stored_a(const Problem& p) {
  return p.trans_a ? Shape{p.k, p.m} : Shape{p.m, p.k};
}
Shape stored_b(const Problem& p) {
  return p.trans_b ? Shape{p.n, p.k} : Shape{p.k, p.n};
}

// C = op(A) op(B) of the problem's shape by cblas_sgemm, row-major (the anchor, and the
// reference its products are checked against).
void sgemm_of(const Problem& p, const float* a, const float* b, float* c) {
  cblas_sgemm(CblasRowMajor, p.trans_a ? CblasTrans : CblasNoTrans,
              p.trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(p.m), static_cast<int>(p.n),
              static_cast<int>(p.k), 1.0f, a, static_cast<int>(p.trans_a ? p.m : p.k), b,
              static_cast<int>(p.trans_b ? p.k : p.n), 0.0f, c, static_cast<int>(p.n));
}

// The values of a tensor as floats (the backend's cast, exact when it widens), times `scale`.
std::vector<float> widened(Backend& backend, const Tensor& t, float scale) {
  Tensor f32 = Tensor::empty(t.shape(), DType::kF32);
  backend.cast(t, f32, {});
  std::vector<float> out(f32.data_as<float>(), f32.data_as<float>() + f32.numel());
  for (float& x : out) x *= scale;
  return out;
}

// The op's product against sgemm's of the same (widened) operands, element by element: both
// sum K exact products in FP32, in their own orders, so they differ by at most 2 K u |A||B|
// (u = 2^-24, |A||B| the product of the magnitudes), and a BF16 output rounds once more, by
// at most 2^-8 of its value. A kernel that computes something else, even in one element, must
// not be timed as a fast one.
void check_product(Backend& backend, const Problem& p, const Tensor& a, const Tensor& b,
                   const Tensor& c, float operand_scale) {
  std::vector<float> a32 = widened(backend, a, operand_scale);
  std::vector<float> b32 = widened(backend, b, operand_scale);
  std::vector<float> ref(static_cast<size_t>(p.m * p.n)), magnitude(ref.size());
  sgemm_of(p, a32.data(), b32.data(), ref.data());
  for (float& x : a32) x = std::fabs(x);
  for (float& x : b32) x = std::fabs(x);
  sgemm_of(p, a32.data(), b32.data(), magnitude.data());
  const std::vector<float> got = widened(backend, c, 1.0f);
  const double sums = 2.0 * static_cast<double>(p.k) * 0x1p-24;
  const double rounding = c.dtype() == DType::kF32 ? 0.0 : 0x1p-8;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double bound = sums * magnitude[i] + rounding * (std::fabs(ref[i]) + sums * magnitude[i]);
    const double error = std::fabs(static_cast<double>(got[i]) - ref[i]);
    if (!(error <= bound)) {
      throw Error(p.name + " " + dtype_name(a.dtype()) + " -> " + dtype_name(c.dtype()) +
                  ": element " + std::to_string(i) + " of the product is " +
                  std::to_string(got[i]) + ", sgemm's " + std::to_string(ref[i]) + " (bound " +
                  std::to_string(bound) + ")");
    }
  }
}

// Per operand and output dtype ("bf16 -> f32"), the op's ratio to sgemm on every shape.
using Ratios = std::map<std::string, std::vector<double>>;

void bench(Backend& backend, const Problem& p, int blas_threads, double min_seconds,
           double peak_gflops, Ratios& ratios, std::mt19937& rng) {
  const Tensor a32 = random_tensor(stored_a(p), DType::kF32, rng);
  const Tensor b32 = random_tensor(stored_b(p), DType::kF32, rng);
  Tensor c32 = Tensor::empty({p.m, p.n}, DType::kF32);
  const auto sgemm = [&] {
    openblas_set_num_threads(blas_threads);
    sgemm_of(p, a32.data_as<float>(), b32.data_as<float>(), c32.data_as<float>());
  };
  const double gflop =
      2e-9 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k);

  Tensor scale = Tensor::empty({1}, DType::kF32);
  scale.data_as<float>()[0] = 1.0f / 256.0f;
  for (DType operands : {DType::kF32, DType::kBF16, DType::kE4M3}) {
    const Tensor a = random_tensor(stored_a(p), operands, rng);
    const Tensor b = random_tensor(stored_b(p), operands, rng);
    for (DType out : {DType::kF32, DType::kBF16}) {
      // cuBLASLt's type table (gemm_checks.h) gives FP32 operands an FP32 output only.
      if (operands == DType::kF32 && out != DType::kF32) continue;
      Tensor c = Tensor::empty({p.m, p.n}, out);
      GemmParams params;
      params.trans_a = p.trans_a;
      params.trans_b = p.trans_b;
      if (is_fp8(operands)) {
        params.a_scale = &scale;
        params.b_scale = &scale;
      }
      const PairTiming t = time_pair(
          sgemm, [&] { backend.gemm(a, b, c, params); }, min_seconds);
      check_product(backend, p, a, b, c, is_fp8(operands) ? scale.data_as<float>()[0] : 1.0f);
      const double sgemm_gflops = gflop / t.anchor_seconds;
      const double gemm_gflops = gflop / t.op_seconds;
      std::printf("%-16s %5lld %5lld %5lld   %-4s  %-4s  %8.1f  %5.2f  %8.1f  %5.2f  %6.3f\n",
                  p.name.c_str(), static_cast<long long>(p.m), static_cast<long long>(p.n),
                  static_cast<long long>(p.k), dtype_name(operands), dtype_name(out), gemm_gflops,
                  gemm_gflops / peak_gflops, sgemm_gflops, sgemm_gflops / peak_gflops,
                  gemm_gflops / sgemm_gflops);
      ratios[std::string(dtype_name(operands)) + " -> " + dtype_name(out)].push_back(gemm_gflops /
                                                                                     sgemm_gflops);
    }
  }
}

}  // namespace

// bench_cpu_gemm [tokens per micro-batch, default 2048] [seconds per timed block, default 0.2]
static int benchmark_main(int argc, char** argv) {
  const mantissa::bench::Arguments args(argc, argv,
                                        "bench_cpu_gemm [tokens (a multiple of 16) [seconds per "
                                        "block >= 0]]");
  args.expect_at_most(2);
  const int64_t tokens = args.whole<int64_t>(1, 2048, 16);
  // The FP8 weight gradients contract over the tokens, and FP8 GEMMs read 16-byte rows.
  if (tokens % 16 != 0) args.fail();
  const double min_seconds = args.number(2, 0.2, 0.0);
  // OpenBLAS's thread count as it started, before the backend makes it single-threaded.
  const int blas_threads = openblas_get_num_threads();

  // The reference model's linear layers as (name, in features K, out features N).
  struct Layer {
    const char* name;
    int64_t in, out;
  };
  const Layer layers[] = {{"qkv", 384, 1152},
                          {"attn_proj", 384, 384},
                          {"fc", 384, 1536},
                          {"fc_proj", 1536, 384},
                          {"lm_head", 384, 256}};
  std::vector<Problem> problems;
  for (const Layer& l : layers) {
    const std::string name = l.name;
    problems.push_back({name + " fwd", tokens, l.out, l.in, false, true});
    problems.push_back({name + " bwd dx", tokens, l.in, l.out, false, false});
    problems.push_back({name + " bwd dW", l.out, l.in, tokens, true, false});
  }

  std::printf(
      "CPU GEMM (backend, %d OpenMP threads) vs cblas_sgemm (OpenBLAS %s, %d threads), "
      "%lld tokens\n",
      omp_get_max_threads(), openblas_get_corename(), blas_threads, static_cast<long long>(tokens));
  std::printf("%s\n", mantissa::core::cpu_paths_description().c_str());
  const mantissa::bench::FmaPeak peak = mantissa::bench::measure_fma_peak();
  std::printf("FP32 FMA peak (measured): %.1f GFLOP/s (%s)\n", peak.gflops,
              peak.describe().c_str());
  if (peak.avx512_switched_off && std::string_view(openblas_get_corename()) != "Haswell") {
    std::printf(
        "note: the peak is the 256-bit one, and OpenBLAS runs its %s kernels, which may be "
        "AVX-512 ones: the sgemm peak column can pass 1 (set OPENBLAS_CORETYPE=Haswell for an "
        "AVX2 CPU's anchor)\n",
        openblas_get_corename());
  }
  std::printf("%-16s %5s %5s %5s   %-4s  %-4s  %8s  %5s  %8s  %5s  %6s\n", "gemm", "M", "N", "K",
              "in", "out", "GFLOP/s", "peak", "sgemm", "peak", "ratio");
  auto backend = make_cpu_backend();
  std::mt19937 rng(1);
  Ratios ratios;
  for (const Problem& p : problems) {
    bench(*backend, p, blas_threads, min_seconds, peak.gflops, ratios, rng);
  }
  std::printf("ratio to sgemm over the %zu shapes:\n", problems.size());
  for (const auto& [dtypes, r] : ratios) {
    double log_sum = 0;
    for (double x : r) log_sum += std::log(x);
    std::printf("  %-12s  lowest %6.3f  geometric mean %6.3f\n", dtypes.c_str(),
                *std::min_element(r.begin(), r.end()),
                std::exp(log_sum / static_cast<double>(r.size())));
  }
  return 0;
}

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_cpu_gemm",
                                         [&] { return benchmark_main(argc, argv); });
}
