// Data-parallel training throughput on the CPU for the reference configuration (a GPT of
// 10.8M parameters: vocab 256, T = 256, d = 384, 6 layers, 6 heads, 8 sequences per step over
// all ranks; bench/torch_gpt.py is the same model in PyTorch), with gradient sync or without it
// (every rank steps alone on its share of the batch: the same compute, no communication). Figures
// only; bench/bench_dist_train.sh runs both next to PyTorch DDP.
//
//   OMP_NUM_THREADS=1 mpirun -np 2 bench_dist_train [sync|nosync] [steps] [bf16|fp32|fp8]
//                                                   [reduce: FP32|BF16|FP8_E4M3|FP8_E5M2]
// (fp8: FP8_HYBRID, the block GEMMs in FP8 and everything else in BF16)
#include <mpi.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "bench/bench_main.h"
#include "dist/data_parallel.h"
#include "models/gpt2/gpt2.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/train_loop.h"

using namespace mantissa;

static int benchmark_main(dist::World& world, int argc, char** argv) {
  const bench::Arguments args(argc, argv,
                              "bench_dist_train [sync|nosync] [steps >= 1] [bf16|fp32|fp8] "
                              "[FP32|BF16|FP8_E4M3|FP8_E5M2]");
  args.expect_at_most(4);
  const std::string mode = args.word(1, "sync", {"sync", "nosync"});
  const int64_t steps = args.whole<int64_t>(2, 6, 1);
  const std::string precision = args.word(3, "bf16", {"bf16", "fp32", "fp8"});
  const std::string reduce = args.word(4, "BF16", {"FP32", "BF16", "FP8_E4M3", "FP8_E5M2"});
  core::DType reduce_dtype = core::DType::kBF16;
  if (reduce == "FP32")
    reduce_dtype = core::DType::kF32;
  else if (reduce == "FP8_E4M3")
    reduce_dtype = core::DType::kE4M3;
  else if (reduce == "FP8_E5M2")
    reduce_dtype = core::DType::kE5M2;
  const core::PrecisionPolicy policy =
      core::PrecisionPolicy::from_mode(precision == "fp32"  ? core::PrecisionMode::kFP32
                                       : precision == "fp8" ? core::PrecisionMode::kFP8Hybrid
                                                            : core::PrecisionMode::kBF16);

  auto backend = core::make_cpu_backend();
  const models::GPT2Config config{6, 6, 384, 256, 256};
  models::GPT2 model(config, *backend, policy, 0);
  const int64_t global_batch = 8;
  // The ranks share the 8 sequences evenly, or tokens_per_s would count some never trained.
  if (global_batch % world.size() != 0) {
    throw bench::UsageError(
        "bench_dist_train runs on 1, 2, 4 or 8 ranks (they share 8 "
        "sequences per step), not " +
        std::to_string(world.size()));
  }
  train::DataLoaderConfig data;
  data.seq_len = config.seq_len;
  data.micro_batch = global_batch / world.size();
  data.world_size = world.size();
  data.rank = world.rank();
  train::DataLoader loader(std::make_shared<const train::Corpus>(train::Corpus::synthetic(1)),
                           data);
  train::TrainLoopConfig loop;
  loop.steps = steps + 1;  // the first step (allocations, page faults) is not timed
  loop.lr.lr = 3e-4;
  loop.loss_scale.mode = core::LossScaleMode::kNone;

  std::unique_ptr<dist::DataParallel> dp;
  std::unique_ptr<train::Optimizer> optimizer;
  if (mode == "sync") {
    dist::DistConfig dist_config;
    dist_config.backend = dist::CommBackend::kMPI;
    dist_config.grad_reduce_dtype = reduce_dtype;
    dp = dist::DataParallel::create(world, *backend, model.parameters(), dist_config);
    optimizer = dp->make_optimizer(loop.adamw);
  } else {
    optimizer = std::make_unique<train::LocalAdamW>(*backend, model.parameters(), loop.adamw);
  }

  using Clock = std::chrono::steady_clock;
  Clock::time_point start;
  double comm_seconds = 0.0;
  int64_t comm_bytes = 0;
  double last_loss = 0.0;
  MPI_Barrier(MPI_COMM_WORLD);
  train::train_loop(model, *backend, policy, loader, loop, *optimizer, dp.get(), {},
                    [&](const train::StepReport& r) {
                      if (r.step == 0) {
                        start = Clock::now();
                        return;
                      }
                      last_loss = r.loss;
                      if (dp) {
                        comm_seconds += dp->last_step_comm_seconds();
                        comm_bytes += dp->last_step_comm_bytes();
                      }
                    });
  double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  MPI_Allreduce(MPI_IN_PLACE, &seconds, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (world.rank() == 0) {
    const double step_s = seconds / static_cast<double>(steps);
    std::printf(
        "mantissa %d ranks %s %s%s: step_s=%.4f tokens_per_s=%.1f exposed_comm_s=%.4f "
        "comm_mib_per_step=%.1f loss=%.4f\n",
        world.size(), precision.c_str(), mode.c_str(),
        mode == "sync" ? (" reduce " + reduce).c_str() : "", step_s,
        static_cast<double>(global_batch * config.seq_len) / step_s,
        comm_seconds / static_cast<double>(steps),
        static_cast<double>(comm_bytes) / static_cast<double>(steps) / (1 << 20), last_loss);
  }
  return 0;
}

int main(int argc, char** argv) {
  dist::World world(&argc, &argv);
  return bench::exit_status_of("bench_dist_train", world,
                               [&] { return benchmark_main(world, argc, argv); });
}
