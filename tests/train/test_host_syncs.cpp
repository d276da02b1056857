// Host synchronisations of a training step (core::Backend::host_syncs), counted on the CPU
// backend, which counts the same calls a GPU would wait at.
//
// A step's reads (every token's loss, the non-finite flag, the first non-finite index, the
// squared gradient norm and, in FP8, the amaxes) take one synchronisation together, overflowing
// or not, however many micro-batches it has: the models' forward and backward never wait (the
// token losses stay on the device until the step copies them with its scalars). Issue 13's
// budget is at most 1 for BF16 and 2 for FP8; both take 1 (FP8 with the DELAYED recipe).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/optim/lr_schedule.h"
#include "core/precision/loss_scaler.h"
#include "models/gpt2/gpt2.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/training_step.h"

namespace mantissa::train {
namespace {

using core::PrecisionMode;
using core::PrecisionPolicy;

const models::GPT2Config kTinyGPT{2, 2, 64, 64, 256};

// Forwards to the model, counting the host synchronisations of its forward and backward.
class CountingModel final : public LanguageModel {
 public:
  CountingModel(LanguageModel& inner, core::Backend& backend) : inner_(inner), backend_(backend) {}

  ParameterStore& parameters() override { return inner_.parameters(); }
  Fp8Operands* fp8_operands() override { return inner_.fp8_operands(); }
  core::Tensor forward(StepContext& ctx, const BatchTensors& batch,
                       float dloss_per_token) override {
    const int64_t before = backend_.host_syncs();
    core::Tensor losses = inner_.forward(ctx, batch, dloss_per_token);
    syncs += backend_.host_syncs() - before;
    return losses;
  }
  void backward(StepContext& ctx) override {
    const int64_t before = backend_.host_syncs();
    inner_.backward(ctx);
    syncs += backend_.host_syncs() - before;
  }
  core::Tensor logits(StepContext& ctx, const core::Tensor& tokens) override {
    return inner_.logits(ctx, tokens);
  }
  int64_t parameter_count() const override { return inner_.parameter_count(); }
  double flops_per_token() const override { return inner_.flops_per_token(); }

  int64_t syncs = 0;

 private:
  LanguageModel& inner_;
  core::Backend& backend_;
};

struct StepSyncs {
  int64_t total = 0;  // the whole TrainingStep::run
  int64_t model = 0;  // inside the model's forward and backward
};

// Runs `steps` steps of the tiny GPT-2 with `micro_batches` micro-batches each; the syncs of
// every step. `plant_inf` makes every step overflow (an inf in the first gradient).
std::vector<StepSyncs> run_steps(PrecisionMode mode, int micro_batches, int steps,
                                 bool plant_inf = false, const core::Fp8ScalingConfig& fp8 = {}) {
  auto backend = core::make_cpu_backend();
  const PrecisionPolicy policy = PrecisionPolicy::from_mode(mode);
  models::GPT2 gpt(kTinyGPT, *backend, policy, 42, fp8);
  CountingModel model(gpt, *backend);
  core::LossScalerConfig scaling;
  scaling.mode = core::LossScaleMode::kStatic;
  scaling.init = 1.0;
  core::LossScaler scaler(scaling);
  LocalAdamW optimizer(*backend, gpt.parameters(), core::AdamWConfig{});
  core::LrScheduleConfig lr;
  lr.total_steps = steps;
  const core::LrSchedule schedule(lr);
  TrainingStep step(model, *backend, policy, scaler, optimizer, schedule, 1.0f);
  if (plant_inf) {
    step.before_check = [](core::Tensor& grads, int64_t) { grads.data_as<float>()[0] = INFINITY; };
  }
  DataLoaderConfig data;
  data.seq_len = kTinyGPT.seq_len;
  data.micro_batch = 2;
  data.seed = 5;
  DataLoader loader(std::make_shared<const Corpus>(Corpus::synthetic(1, 1 << 16)), data);

  std::vector<StepSyncs> out;
  for (int s = 0; s < steps; ++s) {
    std::vector<Batch> batches;
    for (int i = 0; i < micro_batches; ++i) batches.push_back(loader.next());
    model.syncs = 0;
    const int64_t before = backend->host_syncs();
    const StepReport report = step.run(s, batches, nullptr);
    EXPECT_EQ(report.skipped, plant_inf) << "step " << s;
    out.push_back({backend->host_syncs() - before, model.syncs});
  }
  return out;
}

void expect_one_sync_per_step(PrecisionMode mode, int micro_batches, bool plant_inf = false,
                              core::Fp8Recipe recipe = core::Fp8Recipe::kDelayed) {
  const std::string name = std::string(core::precision_mode_name(mode)) + " " +
                           (mode == PrecisionMode::kFP8Hybrid ? core::fp8_recipe_name(recipe) : "");
  core::Fp8ScalingConfig fp8;
  fp8.recipe = recipe;
  if (core::is_block_recipe(recipe)) fp8.grad_format = core::DType::kE4M3;  // ROWWISE's only
  fp8.power_of_two = recipe == core::Fp8Recipe::kMxfp8;                     // E8M0 scales
  for (const StepSyncs& s : run_steps(mode, micro_batches, 3, plant_inf, fp8)) {
    EXPECT_EQ(s.model, 0) << name << ": the model's forward and backward never wait";
    EXPECT_EQ(s.total, 1) << name << ", " << micro_batches << " micro-batches";
  }
}

TEST(HostSyncs, Bf16StepReadsEverythingOnce) {
  expect_one_sync_per_step(PrecisionMode::kBF16, 1);
  expect_one_sync_per_step(PrecisionMode::kBF16, 3);
}

TEST(HostSyncs, Fp8StepReadsScalarsAndAmaxesOnce) {
  expect_one_sync_per_step(PrecisionMode::kFP8Hybrid, 1);
  expect_one_sync_per_step(PrecisionMode::kFP8Hybrid, 2);
}

// CURRENT derives each operand's scale from its own amax on the device, and the block recipes
// scale each operand's blocks there: neither waits for the host inside forward or backward.
TEST(HostSyncs, Fp8RecipesScaleOnTheDevice) {
  for (const core::Fp8Recipe recipe : {core::Fp8Recipe::kCurrent, core::Fp8Recipe::kBlockwise,
                                       core::Fp8Recipe::kRowwise, core::Fp8Recipe::kMxfp8}) {
    expect_one_sync_per_step(PrecisionMode::kFP8Hybrid, 2, false, recipe);
  }
}

TEST(HostSyncs, OverflowingStepReadsItsScalarsOnce) {
  expect_one_sync_per_step(PrecisionMode::kBF16, 1, /*plant_inf=*/true);
  expect_one_sync_per_step(PrecisionMode::kFP8Hybrid, 1, /*plant_inf=*/true);
}

// The losses the step reports are the model's: the mean over every token of every
// micro-batch, as mean_loss() computes it from forward()'s token losses.
TEST(HostSyncs, StepLossIsTheMeanOfTheTokenLosses) {
  auto backend = core::make_cpu_backend();
  const PrecisionPolicy policy = PrecisionPolicy::from_mode(PrecisionMode::kFP32);
  models::GPT2 gpt(kTinyGPT, *backend, policy, 42);
  DataLoaderConfig data;
  data.seq_len = kTinyGPT.seq_len;
  data.micro_batch = 2;
  DataLoader loader(std::make_shared<const Corpus>(Corpus::synthetic(1, 1 << 16)), data);
  const std::vector<Batch> batches{loader.next(), loader.next()};
  StepContext ctx{*backend, policy, nullptr, {}};
  double expected = 0.0;
  for (const Batch& b : batches)
    expected += mean_loss(*backend, gpt.forward(ctx, upload(b, *backend), 0.0f));
  expected /= 2.0;

  core::LossScaler scaler(core::LossScalerConfig{});
  LocalAdamW optimizer(*backend, gpt.parameters(), core::AdamWConfig{});
  core::LrScheduleConfig lr;
  lr.total_steps = 1;
  const core::LrSchedule schedule(lr);
  TrainingStep step(gpt, *backend, policy, scaler, optimizer, schedule, 1.0f);
  EXPECT_NEAR(step.run(0, batches, nullptr).loss, expected, 1e-12 * expected);
}

}  // namespace
}  // namespace mantissa::train
