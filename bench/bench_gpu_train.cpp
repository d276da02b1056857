// Training throughput of the CUDA backend on one GPU: GPT-2 124M (12 layers, 12 heads, width
// 768, 1,024 positions, vocabulary 50,257), `micro_batch` sequences per step, in BF16 and in
// FP8_HYBRID with each recipe the device runs (DELAYED, CURRENT, and BLOCKWISE where cuBLASLt
// has block scales); attention is flash attention where the device has its kernels and
// MANTISSA_FLASH_ATTENTION does not say 0 (core/ops/flash_attention_switch.h), and
// "BF16 no-flash" runs BF16 once more with the materialised attention for the difference. Per
// precision: step time, tokens/s, host synchronisations per step, MFU (against the device's
// data-sheet BF16 peak, core/device_peaks.h, where it is known) and the model's TFLOP/s (6 N + 6 L
// C T per token, as MFU counts them) next to the anchor, the BF16 GEMM rate of cuBLASLt at 8192^3
// measured in the same run (their ratio is the step's efficiency against the library's GEMM).
// `mantissa plan --efficiency` takes a fraction of the data-sheet peaks: the BF16 rows' MFU.
//
//   bench_gpu_train [steps] [micro_batch]     (defaults 10 and 16; the first 2 steps untimed)
//
// Prints "no CUDA device" and exits 0 where there is none. A run that fails prints its error
// in its row and the others still run; the exit status is then 1.
#include <cstdio>
#include <cstdlib>

#include "bench/bench_main.h"
#include "bench/random_operand.h"
#include "core/ops/backend.h"

#if defined(MANTISSA_WITH_CUDA)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/device_peaks.h"
#include "core/error.h"
#include "core/ops/cuda/cuda_check.h"
#include "models/gpt2/gpt2.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/train_loop.h"

namespace mantissa {
namespace {

using Clock = std::chrono::steady_clock;
constexpr const char* kFlashSwitch = "MANTISSA_FLASH_ATTENTION";

// TFLOP/s of a BF16 8192^3 GEMM of random operands (as bench_gpu_gemm's) on the backend: the
// median of 10 timed calls after 3 untimed.
double bf16_gemm_tflops(core::Backend& gpu) {
  constexpr int64_t n = 8192;
  const core::Tensor a = bench::random_operand(gpu, core::Shape{n, n}, core::DType::kBF16, 1);
  const core::Tensor b = bench::random_operand(gpu, core::Shape{n, n}, core::DType::kBF16, 2);
  core::Tensor c = core::Tensor::empty(core::Shape{n, n}, core::DType::kBF16, gpu.device());
  std::vector<double> seconds;
  for (int i = 0; i < 13; ++i) {
    gpu.synchronize();
    const Clock::time_point start = Clock::now();
    gpu.gemm(a, b, c, core::GemmParams{});
    gpu.synchronize();
    if (i >= 3) seconds.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(seconds.begin(), seconds.end());
  return 2.0 * n * n * n / seconds[seconds.size() / 2] * 1e-12;
}

struct Run {
  const char* name;
  core::PrecisionMode mode;
  core::Fp8Recipe recipe;
  bool flash = true;  // false: kFlashSwitch=0 for this run
};

void train_and_report(core::Backend& gpu, const Run& run, int64_t steps, int64_t micro_batch,
                      double gemm_tflops, double peak_flops) {
  const models::GPT2Config config{12, 12, 768, 1024, 50257};
  const core::PrecisionPolicy policy = core::PrecisionPolicy::from_mode(run.mode);
  core::Fp8ScalingConfig fp8;
  fp8.recipe = run.recipe;
  if (run.recipe == core::Fp8Recipe::kBlockwise) fp8.grad_format = core::DType::kE4M3;
  models::GPT2 model(config, gpu, policy, 0, fp8);
  train::DataLoaderConfig data;
  data.seq_len = config.seq_len;
  data.micro_batch = micro_batch;
  train::DataLoader loader(std::make_shared<const train::Corpus>(train::Corpus::synthetic(1)),
                           data);
  train::TrainLoopConfig loop;
  constexpr int64_t kUntimed = 2;  // allocations, cuBLASLt's algorithm choice
  loop.steps = steps + kUntimed;
  loop.lr.lr = 3e-4;
  Clock::time_point start;
  int64_t tokens = 0, syncs = 0;
  double loss = 0;
  train::train_single_rank(model, gpu, policy, loader, loop, {}, [&](const train::StepReport& r) {
    if (r.step + 1 == kUntimed) {
      start = Clock::now();
      syncs = gpu.host_syncs();
      return;
    }
    tokens += r.tokens;
    loss = r.loss;
  });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  const double flops_per_token = model.flops_per_token();
  const double tflops = static_cast<double>(tokens) / seconds * flops_per_token * 1e-12;
  std::printf(
      "%-16s step_ms=%8.2f tokens_per_s=%9.0f host_syncs_per_step=%.1f loss=%.3f mfu=%.3f "
      "model_tflops=%6.1f of_bf16_gemm=%.3f\n",
      run.name, seconds / static_cast<double>(steps) * 1e3, static_cast<double>(tokens) / seconds,
      static_cast<double>(gpu.host_syncs() - syncs) / static_cast<double>(steps), loss,
      peak_flops > 0 ? tflops * 1e12 / peak_flops : 0.0, tflops, tflops / gemm_tflops);
  // A step that is fast but wrong is no figure: its row fails the benchmark.
  MANTISSA_CHECK(std::isfinite(loss), run.name << ": the loss after " << loop.steps << " steps is "
                                               << loss << ", not finite");
}

// The table, one row per run; 1 when a run failed.
int run(int64_t steps, int64_t micro_batch) {
  std::unique_ptr<core::Backend> gpu = core::make_cuda_backend(0);
  cudaDeviceProp prop{};
  MANTISSA_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const double peak = core::gpu_bf16_peak_flops(prop.name);
  const double gemm = bf16_gemm_tflops(*gpu);
  std::printf(
      "%s (BF16 peak %.0f TFLOP/s%s): GPT-2 124M, %lld x 1024 tokens per step, %lld "
      "timed steps; anchor: BF16 GEMM 8192^3 %.1f TFLOP/s\n",
      prop.name, peak * 1e-12, peak > 0 ? "" : ", not known: mfu=0",
      static_cast<long long>(micro_batch), static_cast<long long>(steps), gemm);
  const Run runs[] = {
      {"BF16", core::PrecisionMode::kBF16, core::Fp8Recipe::kDelayed},
      {"FP8 DELAYED", core::PrecisionMode::kFP8Hybrid, core::Fp8Recipe::kDelayed},
      {"FP8 CURRENT", core::PrecisionMode::kFP8Hybrid, core::Fp8Recipe::kCurrent},
      {"FP8 BLOCKWISE", core::PrecisionMode::kFP8Hybrid, core::Fp8Recipe::kBlockwise},
      {"BF16 no-flash", core::PrecisionMode::kBF16, core::Fp8Recipe::kDelayed, false},
  };
  // A run that fails (an unsupported mode, a missing cuBLASLt algorithm) prints its error in
  // its row, and the runs after it are still measured; the exit status says one failed.
  bool failed = false;
  const auto report = [&](const Run& run) {
    try {
      train_and_report(*gpu, run, steps, micro_batch, gemm, peak);
    } catch (const core::Error& e) {
      std::printf("%-16s failed: %s\n", run.name, e.what());
      failed = true;
    }
  };
  for (const Run& run : runs) {
    if (run.recipe == core::Fp8Recipe::kBlockwise) {
      const std::string missing =
          gpu->unsupported_scale_modes(core::ScaleMode::kBlock128, core::ScaleMode::kVec128);
      if (!missing.empty()) {
        std::printf("%-16s skipped: %s\n", run.name, missing.c_str());
        continue;
      }
    }
    if (run.flash) {
      report(run);
      continue;
    }
    const char* setting = std::getenv(kFlashSwitch);
    const std::string user_setting = setting ? setting : "";
    setenv(kFlashSwitch, "0", 1);
    report(run);
    if (setting) {
      setenv(kFlashSwitch, user_setting.c_str(), 1);
    } else {
      unsetenv(kFlashSwitch);
    }
  }
  return failed ? 1 : 0;
}

}  // namespace
}  // namespace mantissa

#endif

int main(int argc, char** argv) {
  using namespace mantissa;
  return bench::exit_status_of("bench_gpu_train", [&] {
    // Read in every build, so that a wrong command line is refused alike with a GPU or without.
    const bench::Arguments args(argc, argv, "bench_gpu_train [steps >= 1] [micro_batch >= 1]");
    args.expect_at_most(2);
    [[maybe_unused]] const int64_t steps = args.whole<int64_t>(1, 10, 1);
    [[maybe_unused]] const int64_t micro_batch = args.whole<int64_t>(2, 16, 1);
#if defined(MANTISSA_WITH_CUDA)
    if (core::cuda_device_available()) return run(steps, micro_batch);
#endif
    std::printf("no CUDA device\n");
    return 0;
  });
}
