// Training on the CUDA backend against the CPU backend: a tiny GPT-2, one with heads of 64
// channels (flash attention on the GPU), and a tiny Llama (with grouped-query attention) trained
// 20 steps from the same seed on the same batches, on each
// backend, in FP32, BF16, FP16 (dynamic loss scale) and FP8_HYBRID. The loss trajectories must
// agree step by step, the same steps must be skipped, both runs must learn, and every parameter
// must end finite.
//
// Tolerances (relative to the CPU's loss at the same step). The two backends compute the
// same functions with different summation orders (cuBLASLt's GEMM tiling against OpenBLAS,
// tree reductions against sequential ones), so each FP32 result
// differs by a few units of FP32 roundoff (~1e-6 relative); in BF16/FP16/FP8 such a
// difference occasionally flips the rounding of a stored value by one unit. AdamW then carries
// the differences forward (it moves each weight by about lr * m / sqrt(v), whatever the size
// of the gradient), so the trajectories drift apart slowly with the step count.
// For scale, the same 20 steps on the CPU backend (losses 5.54 -> 3.54): rounding *every*
// activation to BF16 or FP16 instead of keeping FP32 moves the trajectory by at most 2e-4
// relative at any step, and FP8_HYBRID instead of FP32 by at most 6.3e-3. A change of backend
// perturbs far fewer values than a change of precision, so it should move the losses less:
//   FP32 1e-3, BF16 and FP16 5e-3 (25x the BF16-vs-FP32 drift), FP8_HYBRID 2e-2 (3x the
//   FP8-vs-FP32 drift: a delayed-scaling amax that crosses a power of two on one backend
//   and not the other changes a whole tensor's scale).
// Llama is held to the same bounds; on the CPU backend its BF16-vs-FP32 and FP8-vs-FP32 drifts
// over these 20 steps are of the same order as GPT-2's (test_training prints them).
// A kernel that is wrong in a real way (a wrong rounding mode, scale, index or layout)
// changes the loss by percents or more, or makes it NaN. The first step has no optimizer
// drift, so it is held to a fifth of the bound.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/ops/backend.h"
#include "core/precision/policy.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "tests/gpu/gpu_compare.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/train_loop.h"

namespace mantissa::models {
namespace {

using core::PrecisionMode;

constexpr int64_t kSteps = 20;
const GPT2Config kTinyGPT{2, 2, 64, 64, 256};
// Heads of 64 channels: on the GPU its BF16, FP16 and FP8_HYBRID steps run flash attention
// (core/ops/flash_attention_switch.h), the CPU's the materialised attention.
const GPT2Config kTinyFlashGPT{2, 2, 128, 64, 256};

enum class Family { kGPT2, kGPT2Flash, kLlama };

std::unique_ptr<train::LanguageModel> tiny_model(Family family, core::Backend& backend,
                                                 const core::PrecisionPolicy& policy) {
  if (family == Family::kGPT2) return std::make_unique<GPT2>(kTinyGPT, backend, policy, 42);
  if (family == Family::kGPT2Flash) {
    return std::make_unique<GPT2>(kTinyFlashGPT, backend, policy, 42);
  }
  LlamaConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 64;
  c.ffn_hidden = 176;
  c.seq_len = kTinyGPT.seq_len;
  return std::make_unique<Llama>(c, backend, policy, 42);
}

struct Trajectory {
  std::vector<train::StepReport> reports;
  std::vector<int64_t> host_syncs;  // per step: the backend's waits for its device
  bool parameters_finite = true;
};

// One run on `backend`: the same seeds (model, data) every time.
Trajectory train(core::Backend& backend, Family family, PrecisionMode mode) {
  static const auto corpus =
      std::make_shared<const train::Corpus>(train::Corpus::synthetic(1, 1 << 18));
  const core::PrecisionPolicy policy = core::PrecisionPolicy::from_mode(mode);
  const std::unique_ptr<train::LanguageModel> model = tiny_model(family, backend, policy);
  train::DataLoaderConfig data;
  data.seq_len = kTinyGPT.seq_len;
  data.micro_batch = 8;
  data.seed = 5;
  train::DataLoader loader(corpus, data);
  train::TrainLoopConfig config;
  config.steps = kSteps;
  config.lr.lr = 3e-3;
  config.lr.warmup_steps = 2;
  config.lr.min_lr_ratio = 0.1;
  config.adamw.weight_decay = 0.0f;
  config.loss_scale.mode =
      mode == PrecisionMode::kFP16 ? core::LossScaleMode::kDynamic : core::LossScaleMode::kNone;
  Trajectory run;
  int64_t syncs = backend.host_syncs();
  const auto count_syncs = [&](const train::StepReport&) {
    run.host_syncs.push_back(backend.host_syncs() - syncs);
    syncs = backend.host_syncs();
  };
  run.reports = train::train_single_rank(*model, backend, policy, loader, config, {}, count_syncs);

  core::Tensor& masters = model->parameters().masters();
  core::Tensor host = core::Tensor::empty(masters.shape(), masters.dtype());
  backend.copy(masters, host);
  backend.synchronize();
  const float* m = host.data_as<float>();
  for (int64_t i = 0; i < host.numel(); ++i) {
    if (!std::isfinite(m[i])) run.parameters_finite = false;
  }
  return run;
}

double tolerance(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::kFP32: return 1e-3;
    case PrecisionMode::kFP8Hybrid: return 2e-2;
    default: return 5e-3;
  }
}

const char* family_name(Family family) {
  switch (family) {
    case Family::kGPT2: return "GPT2";
    case Family::kGPT2Flash: return "GPT2Flash";
    case Family::kLlama: return "Llama";
  }
  return "";
}

class GpuTrain : public ::testing::TestWithParam<std::tuple<Family, PrecisionMode>> {};

TEST_P(GpuTrain, LossTrajectoryMatchesTheCpuBackend) {
  if (!core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  const auto [family, mode] = GetParam();
  const std::string name = std::string(family_name(family)) + " " + core::precision_mode_name(mode);
  auto cpu_backend = core::make_cpu_backend();
  auto gpu_backend = core::make_cuda_backend(0);
  // On an A100 (no FP8 tensor cores) the FP8_HYBRID cases are skipped.
  if (mode == PrecisionMode::kFP8Hybrid && !core::gpu_test::fp8_gemms_supported(*gpu_backend)) {
    GTEST_SKIP() << core::gpu_test::kNoFp8TensorCores;
  }
  // The flash family is there to run flash attention; without kernels for its heads it would
  // only repeat the materialised path (skipped on a GPU whose blocks lack the shared memory).
  if (family == Family::kGPT2Flash) {
    const core::DType dtype = core::PrecisionPolicy::from_mode(mode).compute_dtype;
    const std::string unsupported = gpu_backend->unsupported_flash_attention(
        dtype, kTinyFlashGPT.n_embd / kTinyFlashGPT.n_head);
    if (core::gpu_test::lacks_flash_shared_memory(unsupported)) GTEST_SKIP() << unsupported;
    ASSERT_TRUE(unsupported.empty()) << name << ": " << unsupported;
  }
  const Trajectory cpu = train(*cpu_backend, family, mode);
  const Trajectory gpu = train(*gpu_backend, family, mode);
  ASSERT_EQ(cpu.reports.size(), static_cast<size_t>(kSteps));
  ASSERT_EQ(gpu.reports.size(), static_cast<size_t>(kSteps));

  const double tol = tolerance(mode);
  double worst = 0.0;
  for (size_t s = 0; s < cpu.reports.size(); ++s) {
    const train::StepReport& c = cpu.reports[s];
    const train::StepReport& g = gpu.reports[s];
    const double rel = std::fabs(g.loss - c.loss) / c.loss;
    worst = std::max(worst, rel);
    std::printf("%s step %2zu: loss cpu %.6f gpu %.6f (%.2e)%s%s\n", name.c_str(), s, c.loss,
                g.loss, rel, c.skipped ? " cpu skipped" : "", g.skipped ? " gpu skipped" : "");
    EXPECT_TRUE(std::isfinite(g.loss)) << name << " step " << s;
    EXPECT_LE(rel, s == 0 ? tol / 5 : tol)
        << name << " step " << s << ": cpu " << c.loss << ", gpu " << g.loss;
    // The same overflow decisions, so the trajectories stay comparable step by step.
    EXPECT_EQ(g.skipped, c.skipped) << name << " step " << s;
    EXPECT_EQ(g.loss_scale, c.loss_scale) << name << " step " << s;
  }
  std::printf("%s: largest relative loss difference %.2e (bound %.0e)\n", name.c_str(), worst, tol);
  // #13's bound on the host's waits: one per step (the step's scalars and losses together), two
  // for FP8 (its amaxes), on the GPU as on the CPU.
  const int64_t most_syncs = mode == PrecisionMode::kFP8Hybrid ? 2 : 1;
  for (size_t s = 0; s < gpu.host_syncs.size(); ++s) {
    EXPECT_LE(gpu.host_syncs[s], most_syncs) << name << " step " << s << " waited for the GPU";
    EXPECT_LE(cpu.host_syncs[s], most_syncs) << name << " step " << s << " on the CPU";
  }
  for (const Trajectory* run : {&cpu, &gpu}) {
    EXPECT_LT(run->reports.back().loss, run->reports.front().loss - 0.5)
        << name << (run == &cpu ? " on the CPU" : " on the GPU") << " did not learn";
    EXPECT_TRUE(run->parameters_finite) << name << (run == &cpu ? " on the CPU" : " on the GPU");
  }
}

std::string test_name(const ::testing::TestParamInfo<std::tuple<Family, PrecisionMode>>& info) {
  return std::string(family_name(std::get<0>(info.param))) + "_" +
         core::precision_mode_name(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(
    Modes, GpuTrain,
    ::testing::Combine(::testing::Values(Family::kGPT2, Family::kLlama),
                       ::testing::Values(PrecisionMode::kFP32, PrecisionMode::kBF16,
                                         PrecisionMode::kFP16, PrecisionMode::kFP8Hybrid)),
    test_name);

// Flash attention has no FP32 kernel: the GPT2 case covers FP32.
INSTANTIATE_TEST_SUITE_P(Flash, GpuTrain,
                         ::testing::Combine(::testing::Values(Family::kGPT2Flash),
                                            ::testing::Values(PrecisionMode::kBF16,
                                                              PrecisionMode::kFP16,
                                                              PrecisionMode::kFP8Hybrid)),
                         test_name);

}  // namespace
}  // namespace mantissa::models
