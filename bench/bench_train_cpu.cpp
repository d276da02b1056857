// Single-process training throughput on the CPU for the reference configuration (a GPT-2 of
// 10.84M parameters: vocab 256, T = 256, d = 384, 6 layers, 6 heads, 8 sequences per step,
// AdamW at lr 3e-4 on a cosine schedule), with the process's peak resident memory and the
// step's model FLOPs (the model's own count, which mantissa train's MFU uses: llm.c's 6 N +
// 6 L C T per token, N the parameters less the lookup tables, in FP32 terms whatever the
// precision) as a fraction of the FP32 FMA peak measured in the same run (bench/fma_peak.h).
// Figures only; bench/train_cpu_vs_torch.sh runs it next to PyTorch on the same configuration
// (bench/torch_gpt.py).
//
//   bench_train_cpu [fp32|bf16|fp16|fp8] [steps]
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "bench/bench_main.h"
#include "bench/fma_peak.h"
#include "core/ops/backend.h"
#include "core/ops/cpu_switches.h"
#include "models/gpt2/gpt2.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/train_loop.h"

using namespace mantissa;

static int benchmark_main(int argc, char** argv) {
  const bench::Arguments args(argc, argv, "bench_train_cpu [fp32|bf16|fp16|fp8] [steps >= 1]");
  args.expect_at_most(2);
  const std::string precision = args.word(1, "bf16", {"fp32", "bf16", "fp16", "fp8"});
  const int64_t steps = args.whole<int64_t>(2, 6, 1);
  const core::PrecisionMode mode = precision == "fp32"   ? core::PrecisionMode::kFP32
                                   : precision == "fp16" ? core::PrecisionMode::kFP16
                                   : precision == "fp8"  ? core::PrecisionMode::kFP8Hybrid
                                                         : core::PrecisionMode::kBF16;

  std::printf("%s\n", core::cpu_paths_description().c_str());
  const bench::FmaPeak peak = bench::measure_fma_peak();
  auto backend = core::make_cpu_backend();
  const core::PrecisionPolicy policy = core::PrecisionPolicy::from_mode(mode);
  const models::GPT2Config config{6, 6, 384, 256, 256};
  models::GPT2 model(config, *backend, policy, 0);
  train::DataLoaderConfig data;
  data.seq_len = config.seq_len;
  data.micro_batch = 8;
  train::DataLoader loader(std::make_shared<const train::Corpus>(train::Corpus::synthetic(1)),
                           data);
  train::TrainLoopConfig loop;
  loop.steps = steps + 1;  // the first step (allocations, page faults) is not timed
  loop.lr.lr = 3e-4;
  loop.loss_scale.mode = mode == core::PrecisionMode::kFP16 ? core::LossScaleMode::kDynamic
                                                            : core::LossScaleMode::kNone;

  using Clock = std::chrono::steady_clock;
  Clock::time_point start;
  int64_t tokens = 0;
  double last_loss = 0.0;
  train::train_single_rank(model, *backend, policy, loader, loop, {},
                           [&](const train::StepReport& r) {
                             if (r.step == 0) {
                               start = Clock::now();
                               return;
                             }
                             tokens += r.tokens;
                             last_loss = r.loss;
                           });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  const int64_t params = model.parameters().parameter_count();
  const double flops_per_token = model.flops_per_token();
  const double tokens_per_s = static_cast<double>(tokens) / seconds;
  std::printf(
      "mantissa %s: params=%lld step_s=%.4f tokens_per_s=%.1f loss=%.4f peak_rss_mib=%.1f "
      "gflops=%.1f fma_peak_gflops=%.1f (%s) fraction_of_peak=%.3f\n",
      core::precision_mode_name(mode), static_cast<long long>(params),
      seconds / static_cast<double>(steps), tokens_per_s, last_loss,
      static_cast<double>(usage.ru_maxrss) / 1024.0, tokens_per_s * flops_per_token * 1e-9,
      peak.gflops, peak.describe().c_str(), tokens_per_s * flops_per_token * 1e-9 / peak.gflops);
  return 0;
}

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_train_cpu",
                                         [&] { return benchmark_main(argc, argv); });
}
