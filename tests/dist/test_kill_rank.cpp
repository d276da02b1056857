// A rank dies (SIGKILL, as by kill -9) in the middle of a training run; the others must end,
// non-zero, within dist.timeout_s plus a few seconds, with a message naming the dead rank.
// Driven by kill_rank_test.sh, which runs this under mpirun and checks the outcome.
//
//   test_kill_rank TIMEOUT_S
// Rank 1 prints the wall-clock time (seconds since the epoch) and kills itself at the start
// of step 3; the survivors enter step 3's gradient sync and wait for it.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <memory>

#include "dist/data_parallel.h"
#include "models/gpt2/gpt2.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/train_loop.h"

using namespace mantissa;

int main(int argc, char** argv) {
  dist::World world(&argc, &argv);
  const double timeout_s = argc > 1 ? std::atof(argv[1]) : 5.0;
  auto backend = core::make_cpu_backend();
  const core::PrecisionPolicy policy = core::PrecisionPolicy::from_mode(core::PrecisionMode::kBF16);
  models::GPT2 model({2, 2, 64, 64, 256}, *backend, policy, 1);
  dist::DistConfig config;
  config.backend = dist::CommBackend::kMPI;
  config.timeout_s = timeout_s;
  auto dp = dist::DataParallel::create(world, *backend, model.parameters(), config);
  auto optimizer = dp->make_optimizer(core::AdamWConfig{});
  train::DataLoader loader(
      std::make_shared<const train::Corpus>(train::Corpus::synthetic(1, 1 << 16)),
      {64, 2, world.size(), world.rank(), 1});
  train::TrainLoopConfig loop;
  loop.steps = 6;
  loop.loss_scale.mode = core::LossScaleMode::kNone;
  train::train_loop(
      model, *backend, policy, loader, loop, *optimizer, dp.get(), [&](train::TrainingStep& step) {
        // before_check runs after the sync of a step: kill at the end of step 2,
        // so the survivors block in step 3.
        step.before_check = [&](core::Tensor&, int64_t s) {
          if (world.rank() != 1 || s != 2) return;
          const double now =
              std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                  .count();
          std::printf("test_kill_rank: rank 1 sends itself SIGKILL at %.3f\n", now);
          std::fflush(stdout);
          std::raise(SIGKILL);
        };
      });
  std::printf("test_kill_rank: rank %d finished the run, which it should not have\n", world.rank());
  return 0;
}
