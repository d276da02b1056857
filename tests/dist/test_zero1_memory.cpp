// ZeRO-1's memory, on 1, 2 and 4 ranks: each rank keeps ONLY its shard of the FP32 masters and
// of the AdamW moments, so masters + moments take 12 bytes per parameter / N per rank (to
// within the shard alignment), against 12 bytes per parameter under ZeRO-0. The shards tile the
// flat buffer, and they stay shard-sized through training steps. Rank 0 prints the figures.
// A model can also be built with its shard from the start (what the trainer does), so that no
// rank ever holds all the masters.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "dist/data_parallel.h"
#include "models/gpt2/gpt2.h"
#include "tests/dist/dist_test.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/train_loop.h"

namespace mantissa::dist {
namespace {

using core::DType;

const models::GPT2Config kGPT{4, 4, 128, 64, 256};
const core::PrecisionPolicy kPolicy = core::PrecisionPolicy::from_mode(core::PrecisionMode::kBF16);

DistConfig dist_config(int zero_stage) {
  DistConfig config;
  config.backend = CommBackend::kMPI;
  config.grad_reduce_dtype = DType::kBF16;
  config.zero_stage = zero_stage;
  config.timeout_s = 120;
  return config;
}

struct RankBytes {
  int64_t masters = 0;
  int64_t moments = 0;
  int64_t owned_begin = 0;  // the flat range whose masters and moments they are
  int64_t owned_end = 0;
};

// Masters and moments this rank holds (and the range they cover) after training `model` (on
// `backend`) for `steps` steps with a DataParallel of `zero_stage`.
RankBytes bytes_after_training(models::GPT2& model, core::Backend& backend, int zero_stage,
                               int64_t steps) {
  World& world = testing::world();
  train::ParameterStore& params = model.parameters();
  auto dp = DataParallel::create(world, backend, params, dist_config(zero_stage));
  dp->broadcast_parameters();
  train::TrainLoopConfig loop;
  loop.steps = steps;
  auto optimizer = dp->make_optimizer(loop.adamw);
  const void* masters = params.masters().data();
  train::DataLoader loader(
      std::make_shared<const train::Corpus>(train::Corpus::synthetic(1, 1 << 16)),
      {kGPT.seq_len, 2, world.size(), world.rank(), 5});
  train::train_loop(model, backend, kPolicy, loader, loop, *optimizer, dp.get());
  EXPECT_EQ(params.masters().data(), masters) << "the masters were reallocated";

  const int64_t owned = optimizer->owned_end() - optimizer->owned_begin();
  EXPECT_EQ(params.masters_begin(), optimizer->owned_begin());
  EXPECT_EQ(params.masters().numel(), owned) << "the store keeps more masters than it owns";
  EXPECT_EQ(optimizer->first_moment().numel(), owned);
  EXPECT_EQ(optimizer->second_moment().numel(), owned);
  ReplicaState state;
  state.step = steps;
  state.optimizer_steps = optimizer->steps_taken();
  dp->check_consistency(state);  // the compute copies agree after the gathers
  return {static_cast<int64_t>(params.masters().nbytes()), optimizer->state_bytes(),
          optimizer->owned_begin(), optimizer->owned_end()};
}

TEST(Zero1Memory, MastersAndMomentsShrinkAsOneOverN) {
  World& world = testing::world();
  const int n = world.size();
  auto backend = core::make_cpu_backend();
  const int64_t flat = models::GPT2(kGPT, *backend, kPolicy, 5).parameters().flat_numel();
  // Shards: ceil(flat / N) rounded up to the parameter alignment (the last ones shorter).
  const int64_t alignment = train::kParameterAlignment;
  const int64_t shard_limit = ((flat + n - 1) / n + alignment - 1) / alignment * alignment;

  models::GPT2 model0(kGPT, *backend, kPolicy, 5), model1(kGPT, *backend, kPolicy, 5);
  const RankBytes zero0 = bytes_after_training(model0, *backend, 0, 2);
  const RankBytes zero1 = bytes_after_training(model1, *backend, 1, 2);
  EXPECT_EQ(zero0.masters, 4 * flat);
  EXPECT_EQ(zero0.moments, 8 * flat);
  EXPECT_LE(zero1.masters, 4 * shard_limit);
  EXPECT_EQ(zero1.moments, 2 * zero1.masters);
  // Together the ranks hold every master and moment exactly once: their ranges follow one
  // another, in rank order, from 0 to the end of the flat buffer.
  std::vector<RankBytes> all(static_cast<size_t>(n));
  MPI_Allgather(&zero1, 4, MPI_INT64_T, all.data(), 4, MPI_INT64_T, MPI_COMM_WORLD);
  int64_t total = 0, next = 0;
  for (int r = 0; r < n; ++r) {
    const RankBytes& b = all[static_cast<size_t>(r)];
    total += b.masters + b.moments;
    EXPECT_EQ(b.owned_begin, next) << "rank " << r << "'s shard";
    EXPECT_EQ(b.masters, 4 * (b.owned_end - b.owned_begin)) << "rank " << r;
    next = b.owned_end;
  }
  EXPECT_EQ(next, flat);
  EXPECT_EQ(total, 12 * flat);

  if (world.rank() == 0) {
    std::printf(
        "%d rank%s, %lld flat parameters, masters + moments per rank: ZeRO-0 %lld bytes; "
        "ZeRO-1",
        n, n == 1 ? "" : "s", static_cast<long long>(flat),
        static_cast<long long>(zero0.masters + zero0.moments));
    for (int r = 0; r < n; ++r) {
      const RankBytes& b = all[static_cast<size_t>(r)];
      std::printf("%s rank %d %lld + %lld = %lld bytes", r == 0 ? ":" : ",", r,
                  static_cast<long long>(b.masters), static_cast<long long>(b.moments),
                  static_cast<long long>(b.masters + b.moments));
    }
    std::printf(" (limit %lld)\n", static_cast<long long>(12 * shard_limit));
  }
}

// What the trainer does under ZeRO-1: the model is built with this rank's shard of the masters
// (never all of them at once), DataParallel takes the store as it is, and training gives the
// same masters and compute copy as a model cut down to its shard by DataParallel::create.
// A store allocated for another rank's shard is refused, naming both ranges.
TEST(Zero1Memory, AModelBuiltWithItsShardNeverHoldsAllMasters) {
  World& world = testing::world();
  const int n = world.size();
  auto backend = core::make_cpu_backend();
  models::GPT2 sharded(kGPT, *backend, kPolicy, 5, {}, train::MasterShard{world.rank(), n});
  models::GPT2 cut(kGPT, *backend, kPolicy, 5);
  train::ParameterStore& params = sharded.parameters();
  const std::vector<int64_t> shards = train::split_aligned(params.flat_numel(), n);
  EXPECT_EQ(params.masters().numel(), shards[static_cast<size_t>(world.rank())]);
  EXPECT_EQ(n == 1, params.keeps_all_masters());

  bytes_after_training(sharded, *backend, 1, 2);
  bytes_after_training(cut, *backend, 1, 2);
  const train::ParameterStore& reference = cut.parameters();
  ASSERT_EQ(params.masters_begin(), reference.masters_begin());
  ASSERT_EQ(params.masters().nbytes(), reference.masters().nbytes());
  EXPECT_EQ(
      std::memcmp(params.masters().data(), reference.masters().data(), params.masters().nbytes()),
      0);
  EXPECT_EQ(std::memcmp(params.compute().data(), cut.parameters().compute().data(),
                        params.compute().nbytes()),
            0);

  if (n > 1) {
    models::GPT2 other(kGPT, *backend, kPolicy, 5, {},
                       train::MasterShard{(world.rank() + 1) % n, n});
    try {
      DataParallel::create(world, *backend, other.parameters(), dist_config(1));
      ADD_FAILURE() << "a store holding another rank's shard was accepted";
    } catch (const core::Error& e) {
      EXPECT_NE(std::string(e.what()).find("owns the ZeRO-1 shard"), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace mantissa::dist
