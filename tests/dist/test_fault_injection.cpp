// One decision for all ranks. An inf is planted in the gradients of ONE rank at several steps
// of a 4-rank run (debug.inject_nonfinite_rank / inject_nonfinite_steps, through
// train::nonfinite_injector): every rank must skip exactly those steps, the loss scale must
// be the same on every rank after every step, and the replicas (the FP32 masters; under
// ZeRO-1 the compute copy, since the masters are sharded) must stay bit-identical, which the
// consistency check verifies after every step. Covered with a BF16 reduce, and with FP8
// E4M3 under ZeRO-1, where the injecting rank owns only a shard of the reduced gradients.
// (The injector plants the inf after the reduction, so that the decision itself is what is
// tested; that the non-finite check runs before a saturating FP8 cast could hide an inf is
// tested in test_grad_sync.cpp.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <vector>

#include "dist/data_parallel.h"
#include "models/gpt2/gpt2.h"
#include "tests/dist/dist_test.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/fault_injection.h"
#include "train/training_step.h"

namespace mantissa::dist {
namespace {

using core::DType;

struct FaultCase {
  const char* name;
  DType reduce;
  int zero_stage;
};

void run_with_injection(const FaultCase& c) {
  World& world = testing::world();
  const int culprit = world.size() - 1;
  const std::vector<int64_t> poisoned = {3, 7, 8, 15};
  const int64_t steps = 18;

  auto backend = core::make_cpu_backend();
  const core::PrecisionPolicy policy = core::PrecisionPolicy::from_mode(core::PrecisionMode::kBF16);
  models::GPT2 model({2, 2, 64, 64, 256}, *backend, policy, 9);
  DistConfig config;
  config.backend = CommBackend::kMPI;
  config.grad_reduce_dtype = c.reduce;
  config.zero_stage = c.zero_stage;
  config.bucket_mb = 0.1;
  config.timeout_s = 120;
  auto dp = DataParallel::create(world, *backend, model.parameters(), config);
  dp->broadcast_parameters();
  auto optimizer = dp->make_optimizer(core::AdamWConfig{});
  core::LossScalerConfig scaler_config;  // dynamic, 2^16
  scaler_config.hysteresis = 1;          // every overflow backs off
  scaler_config.growth_interval = 4;     // and the scale grows back in between
  core::LossScaler scaler(scaler_config);
  const core::LrSchedule schedule(core::LrScheduleConfig{1e-3, 0, steps, 0.0});
  train::TrainingStep step(model, *backend, policy, scaler, *optimizer, schedule, 1.0f);
  step.before_check = train::nonfinite_injector(*backend, world.rank(), culprit, poisoned);
  train::DataLoader loader(
      std::make_shared<const train::Corpus>(train::Corpus::synthetic(1, 1 << 18)),
      {64, 2, world.size(), world.rank(), 3});

  int skipped = 0;
  for (int64_t s = 0; s < steps; ++s) {
    const train::StepReport report = step.run(s, {loader.next()}, dp.get());
    const bool expected = std::find(poisoned.begin(), poisoned.end(), s) != poisoned.end();
    EXPECT_EQ(report.skipped, expected) << c.name << ": step " << s << " on rank " << world.rank();
    skipped += report.skipped ? 1 : 0;
    // The same scale everywhere: max(scale) == scale == -max(-scale).
    std::vector<float> extremes{scaler.scale(), -scaler.scale()};
    dp->max_across_ranks(extremes);
    EXPECT_EQ(extremes[0], scaler.scale()) << c.name << ": scales differ after step " << s;
    EXPECT_EQ(-extremes[1], scaler.scale()) << c.name << ": scales differ after step " << s;
    // Scaler state and replicas identical on every rank (throws otherwise).
    ReplicaState state;
    state.step = s + 1;
    state.scaler = scaler.state();
    state.optimizer_steps = optimizer->steps_taken();
    dp->check_consistency(state);
  }
  EXPECT_EQ(skipped, static_cast<int>(poisoned.size())) << c.name;
  EXPECT_EQ(scaler.state().overflow_steps_total, static_cast<int64_t>(poisoned.size()));
  EXPECT_EQ(optimizer->steps_taken(), steps - static_cast<int64_t>(poisoned.size()));
  if (world.rank() == 0) {
    std::printf(
        "%s: inf on rank %d at steps 3, 7, 8, 15: %d of %lld steps skipped on every "
        "rank, final scale %.0f everywhere, replicas bit-identical\n",
        c.name, culprit, skipped, static_cast<long long>(steps), scaler.scale());
  }
}

TEST(FaultInjection, BF16ReduceSkipsTheSameStepsOnEveryRank) {
  run_with_injection({"BF16 reduce, ZeRO-0", DType::kBF16, 0});
}

TEST(FaultInjection, FP8ReduceUnderZero1SkipsTheSameStepsOnEveryRank) {
  run_with_injection({"FP8_E4M3 reduce, ZeRO-1", DType::kE4M3, 1});
}

}  // namespace
}  // namespace mantissa::dist
