// GEMM throughput of the CUDA backend: BF16 and FP8 (E4M3) through cuBLASLt at 8192^3 and at
// GPT-2 shapes, the FP8 recipes' block-scaled GEMMs next to per-tensor FP8, plus
// device-to-device copy bandwidth as the anchor for memory-bound kernels.
//
//   bench_gpu_gemm [repetitions >= 1]
//
// Each figure is the median of `repetitions` (default 20) timed calls, after warm-up, timed
// with CUDA events on the backend's stream. Targets on an H200: BF16 >= 700 TFLOP/s, FP8 at
// least 1.6x BF16. Prints "no CUDA device" and exits 0 where there is none. A configuration
// that fails (no cuBLASLt algorithm for it, say) prints "failed" in its cell and its error
// after the table; the others are still measured, and the exit status is 1.
#include <cstdio>

#include "bench/bench_main.h"
#include "bench/bench_timing.h"
#include "bench/random_operand.h"
#include "core/ops/backend.h"

#if defined(MANTISSA_WITH_CUDA)
#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_handles.h"

namespace mantissa::core {
namespace {

using mantissa::bench::median;
using mantissa::bench::random_operand;

// Median milliseconds of one call of `op` queued on the backend's stream.
double median_ms(CudaBackend& gpu, const std::function<void()>& op, int repetitions) {
  constexpr int kWarmup = 3;
  for (int i = 0; i < kWarmup; ++i) op();
  gpu.synchronize();
  CudaEvent start(cudaEventDefault);
  CudaEvent stop(cudaEventDefault);
  std::vector<double> times;
  for (int i = 0; i < repetitions; ++i) {
    MANTISSA_CUDA_CHECK(cudaEventRecord(start.get(), gpu.stream()));
    op();
    MANTISSA_CUDA_CHECK(cudaEventRecord(stop.get(), gpu.stream()));
    MANTISSA_CUDA_CHECK(cudaEventSynchronize(stop.get()));
    float ms = 0.0f;
    MANTISSA_CUDA_CHECK(cudaEventElapsedTime(&ms, start.get(), stop.get()));
    times.push_back(ms);
  }
  return median(times);
}

// The errors of the measurements that failed, each named by its shape and configuration.
std::vector<std::string> failures;

// measure()'s TFLOP/s, or 0 with its error recorded in `failures` under `what`.
double measured_or_zero(const std::string& what, const std::function<double()>& measure) {
  try {
    return measure();
  } catch (const Error& e) {
    failures.push_back(what + ": " + e.what());
    return 0.0;
  }
}

// One table cell: the figure, or "failed" for a measurement that gave 0.
void print_cell(int width, double tflops) {
  if (tflops > 0.0) {
    std::printf(" %*.1f", width, tflops);
  } else {
    std::printf(" %*s", width, "failed");
  }
  std::fflush(stdout);
}

struct BenchShape {
  const char* name;
  int64_t m, n, k;
};

struct Config {
  const char* name;
  DType in;
  DType out;
  bool fast_accumulate;
};

// TFLOP/s of C[m, n] = A[m, k] B[n, k]^T: the forward layout of a Linear layer (weights stored
// [out, in]), which FP8 kernels take as is.
double gemm_tflops(CudaBackend& gpu, const Tensor& a, const Tensor& b, const Config& config,
                   int repetitions) {
  const int64_t m = a.dim(0);
  const int64_t n = b.dim(0);
  const int64_t k = a.dim(1);
  Tensor c = Tensor::empty(Shape{m, n}, config.out, gpu.device());
  Tensor scale = Tensor::empty(Shape{1}, DType::kF32, gpu.device());
  gpu.fill(scale, 1.0f / 200.0f);
  GemmParams p;
  p.trans_b = true;
  p.fast_accumulate = config.fast_accumulate;
  if (is_fp8(config.in)) {
    p.a_scale = &scale;
    p.b_scale = &scale;
  }
  const double ms = median_ms(
      gpu, [&] { gpu.gemm(a, b, c, p); }, repetitions);
  return 2.0 * static_cast<double>(m) * n * k / (ms * 1e-3) / 1e12;
}

// TFLOP/s of the same product with block-scaled E4M3 operands in scale modes a_mode x b_mode
// (core/precision/block_scaling.h), BF16 output; the scale tensors hold one value (timing does
// not depend on it).
double scaled_gemm_tflops(CudaBackend& gpu, const Tensor& a, const Tensor& b, ScaleMode a_mode,
                          ScaleMode b_mode, int repetitions) {
  const int64_t m = a.dim(0);
  const int64_t n = b.dim(0);
  const int64_t k = a.dim(1);
  Tensor c = Tensor::empty(Shape{m, n}, DType::kBF16, gpu.device());
  const auto scales = [&](ScaleMode mode, int64_t rows) {
    Tensor t = Tensor::empty(Shape{scale_count(mode, rows, k)}, scale_dtype(mode), gpu.device());
    if (mode == ScaleMode::kVec32Ue8m0) {
      MANTISSA_CUDA_CHECK(cudaMemsetAsync(t.data(), 119, t.nbytes(), gpu.stream()));  // 2^-8
    } else {
      gpu.fill(t, 1.0f / 200.0f);
    }
    return t;
  };
  const Tensor sa = scales(a_mode, m);
  const Tensor sb = scales(b_mode, n);
  GemmParams p;
  p.trans_b = true;
  p.a_scale = &sa;
  p.b_scale = &sb;
  p.a_scale_mode = a_mode;
  p.b_scale_mode = b_mode;
  const double ms = median_ms(
      gpu, [&] { gpu.gemm(a, b, c, p); }, repetitions);
  return 2.0 * static_cast<double>(m) * n * k / (ms * 1e-3) / 1e12;
}

// The FP8 recipes' forward GEMM (core/precision/fp8_scaling.h) next to per-tensor scales
// (e4m3->bf16 without fast accumulation, which block scales do not have either).
void print_recipes(CudaBackend& gpu, int repetitions) {
  struct Recipe {
    const char* name;
    ScaleMode a, b;
  };
  const Recipe recipes[] = {{"BLOCKWISE", ScaleMode::kVec128, ScaleMode::kBlock128},
                            {"ROWWISE", ScaleMode::kOuterVec, ScaleMode::kOuterVec},
                            {"MXFP8", ScaleMode::kVec32Ue8m0, ScaleMode::kVec32Ue8m0}};
  const BenchShape shapes[] = {{"8192^3", 8192, 8192, 8192}, {"gpt2 mlp fc", 8192, 3072, 768}};
  std::printf("\nFP8 recipes, e4m3 -> bf16, TFLOP/s and ratio to per-tensor scales\n");
  for (const BenchShape& s : shapes) {
    const Tensor a = random_operand(gpu, Shape{s.m, s.k}, DType::kE4M3, 5);
    const Tensor b = random_operand(gpu, Shape{s.n, s.k}, DType::kE4M3, 6);
    const double tensor = measured_or_zero(std::string(s.name) + " per-tensor", [&] {
      return gemm_tflops(gpu, a, b, {"e4m3->bf16", DType::kE4M3, DType::kBF16, false}, repetitions);
    });
    std::printf("%-16s per-tensor", s.name);
    print_cell(8, tensor);
    for (const Recipe& r : recipes) {
      const std::string why = gpu.unsupported_scale_modes(r.a, r.b);
      if (!why.empty()) {
        std::printf(" | %s: not on this device", r.name);
        continue;
      }
      const double t = measured_or_zero(std::string(s.name) + " " + r.name, [&] {
        return scaled_gemm_tflops(gpu, a, b, r.a, r.b, repetitions);
      });
      std::printf(" | %s", r.name);
      print_cell(8, t);
      if (t > 0.0 && tensor > 0.0) std::printf(" (%.2fx)", t / tensor);
    }
    std::printf("\n");
  }
  std::printf("target: BLOCKWISE >= 0.85x per-tensor at 8192^3\n");
}

// cudaMemcpy device to device: every byte is read once and written once.
double copy_gb_per_s(CudaBackend& gpu, int repetitions) {
  constexpr int64_t kBytes = int64_t{1} << 30;
  Tensor src = Tensor::empty(Shape{kBytes}, DType::kU8, gpu.device());
  Tensor dst = Tensor::empty(Shape{kBytes}, DType::kU8, gpu.device());
  gpu.fill(src, 1.0f);
  const double ms = median_ms(
      gpu, [&] { gpu.copy(src, dst); }, repetitions);
  return 2.0 * static_cast<double>(kBytes) / (ms * 1e-3) / 1e9;
}

int run(int repetitions) {
  auto backend = make_cuda_backend(0);
  auto& gpu = static_cast<CudaBackend&>(*backend);
  cudaDeviceProp props{};
  MANTISSA_CUDA_CHECK(cudaGetDeviceProperties(&props, 0));
  std::printf("device: %s, compute capability %d.%d, %d SMs; median of %d calls\n\n", props.name,
              props.major, props.minor, gpu.multiprocessor_count(), repetitions);
  std::printf("device copy (cudaMemcpy D2D, 1 GiB): %.0f GB/s (read + write)\n\n",
              copy_gb_per_s(gpu, repetitions));

  // GPT-2 124M with 8 x 1024 tokens per step, and the classic square benchmark.
  const BenchShape shapes[] = {
      {"8192^3", 8192, 8192, 8192},       {"gpt2 qkv", 8192, 2304, 768},
      {"gpt2 attn proj", 8192, 768, 768}, {"gpt2 mlp fc", 8192, 3072, 768},
      {"gpt2 mlp proj", 8192, 768, 3072}, {"gpt2 lm head", 8192, 50304, 768}};
  std::vector<Config> configs = {{"bf16", DType::kBF16, DType::kBF16, false},
                                 {"e4m3->bf16", DType::kE4M3, DType::kBF16, false},
                                 {"e4m3->bf16 fast", DType::kE4M3, DType::kBF16, true},
                                 {"e4m3->f32 fast", DType::kE4M3, DType::kF32, true}};
  if (gpu.compute_capability() < 89) {
    std::printf("(no FP8 tensor cores on this device: BF16 only)\n");
    configs.resize(1);
  }
  std::printf("%-16s %20s", "TFLOP/s", "m x n x k");
  for (const Config& c : configs) std::printf(" %16s", c.name);
  if (configs.size() > 1) std::printf(" %12s", "fp8/bf16");
  std::printf("\n");
  for (const BenchShape& s : shapes) {
    const std::string dims =
        std::to_string(s.m) + "x" + std::to_string(s.n) + "x" + std::to_string(s.k);
    std::printf("%-16s %20s", s.name, dims.c_str());
    // Operands per input dtype, shared by the configurations that read them.
    const Tensor a_bf16 = random_operand(gpu, Shape{s.m, s.k}, DType::kBF16, 1);
    const Tensor b_bf16 = random_operand(gpu, Shape{s.n, s.k}, DType::kBF16, 2);
    Tensor a_fp8;
    Tensor b_fp8;
    if (configs.size() > 1) {
      a_fp8 = random_operand(gpu, Shape{s.m, s.k}, DType::kE4M3, 3);
      b_fp8 = random_operand(gpu, Shape{s.n, s.k}, DType::kE4M3, 4);
    }
    std::vector<double> tflops;
    for (const Config& c : configs) {
      const bool fp8 = is_fp8(c.in);
      tflops.push_back(measured_or_zero(std::string(s.name) + " " + c.name, [&] {
        return gemm_tflops(gpu, fp8 ? a_fp8 : a_bf16, fp8 ? b_fp8 : b_bf16, c, repetitions);
      }));
      print_cell(16, tflops.back());
    }
    // The best FP8 configuration against BF16.
    const double best_fp8 =
        configs.size() > 1 ? *std::max_element(tflops.begin() + 1, tflops.end()) : 0.0;
    if (best_fp8 > 0.0 && tflops[0] > 0.0) std::printf(" %11.2fx", best_fp8 / tflops[0]);
    std::printf("\n");
  }
  std::printf("\ntargets (H200): bf16 >= 700 TFLOP/s at 8192^3; fp8 >= 1.6x bf16\n");
  if (gpu.compute_capability() >= 89) print_recipes(gpu, repetitions);
  if (failures.empty()) return 0;
  std::printf("\nfailed:\n");
  for (const std::string& f : failures) std::printf("  %s\n", f.c_str());
  return 1;
}

}  // namespace
}  // namespace mantissa::core
#endif

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_gpu_gemm", [&] {
    // Read in every build, so that a wrong command line is refused alike with a GPU or without.
    const mantissa::bench::Arguments args(argc, argv, "bench_gpu_gemm [repetitions >= 1]");
    args.expect_at_most(1);
    [[maybe_unused]] const int repetitions = args.whole<int>(1, 20, 1);
#if defined(MANTISSA_WITH_CUDA)
    if (mantissa::core::cuda_device_available()) return mantissa::core::run(repetitions);
#endif
    std::printf("no CUDA device\n");
    return 0;
  });
}
