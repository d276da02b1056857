// Held-out data and evaluation:
//  - Corpus::split_tail holds out exactly the last fraction of the tokens, across segments,
//    sharing the corpus's memory;
//  - the Evaluator's slices of the validation windows, summed over any number of ranks, give
//    the single-rank sum (FP32), whatever the micro-batch; every evaluation of the same weights
//    gives the same loss; and the windows are the corpus's first ones, laid end to end;
//  - a model that takes a multiple of 8 tokens per forward pass (FP8 BLOCKWISE) is evaluated
//    in whole groups of windows, on any number of ranks and micro-batch;
//  - progress is reported after every micro-batch, and a progress callback that says stop
//    abandons the evaluation at once; every rank reports as often (the most micro-batches of
//    any rank's slice), one with fewer windows or none too, so the callback may hold a
//    collective;
//  - a validation set without one whole window (or group) is a config error naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/ops/backend.h"
#include "core/precision/block_scaling.h"
#include "core/precision/fp8_scaling.h"
#include "models/gpt2/gpt2.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/evaluate.h"
#include "train/language_model.h"
#include "train/step_context.h"

namespace mantissa::train {
namespace {

using core::PrecisionMode;
using core::PrecisionPolicy;

TEST(Corpus, SplitTailHoldsOutTheLastFraction) {
  const Corpus whole = Corpus::synthetic(3, 1000);
  const auto [head, tail] = whole.split_tail(0.25);
  EXPECT_EQ(head.num_tokens(), 750);
  EXPECT_EQ(tail.num_tokens(), 250);
  ASSERT_EQ(head.segments().size(), 1u);
  ASSERT_EQ(tail.segments().size(), 1u);
  // Views into the same tokens: the tail starts where the head ends.
  const auto* first = static_cast<const uint16_t*>(whole.segments()[0].data());
  EXPECT_EQ(head.segments()[0].data(), first);
  EXPECT_EQ(tail.segments()[0].data(), first + 750);

  const auto [all, none] = whole.split_tail(0.0);
  EXPECT_EQ(all.num_tokens(), 1000);
  EXPECT_EQ(none.num_tokens(), 0);
  EXPECT_THROW(whole.split_tail(1.0), core::Error);
}

TEST(Corpus, SyntheticValidationIsAnotherCorpus) {
  const Corpus train = Corpus::synthetic(3, 4096);
  const Corpus val = Corpus::synthetic_validation(3, 4096);
  auto tokens = [](const Corpus& corpus) {
    std::vector<int32_t> all(static_cast<size_t>(corpus.num_tokens()));
    corpus.segments()[0].read(0, all, corpus.vocab_size());
    return all;
  };
  EXPECT_NE(tokens(train), tokens(val));
  EXPECT_EQ(tokens(val), tokens(Corpus::synthetic_validation(3, 4096)));
}

TEST(Evaluator, RankSlicesAddUpToTheWholeInFP32) {
  auto be = core::make_cpu_backend();
  const PrecisionPolicy policy = PrecisionPolicy::from_mode(PrecisionMode::kFP32);
  const models::GPT2Config config{2, 2, 32, 16, 256};
  models::GPT2 model(config, *be, policy, 7);
  auto corpus = std::make_shared<const Corpus>(Corpus::synthetic_validation(1, 5000));
  const int64_t eval_tokens = 40 * config.seq_len;  // 40 windows

  const Evaluator one(corpus, config.seq_len, eval_tokens, 8, 1, 0);
  EXPECT_EQ(one.tokens(), eval_tokens);
  const double whole = one.local_loss_sum(model, *be, policy).value();
  EXPECT_EQ(one.local_loss_sum(model, *be, policy).value(), whole) << "the same tokens every time";
  EXPECT_NEAR(whole / static_cast<double>(eval_tokens), std::log(256.0), 0.5)
      << "an untrained model is near uniform";
  // The windows are the corpus's first 40, laid end to end: window w's inputs are tokens
  // [w T, w T + T), its targets one further. One forward of all 40 gives the same sum.
  const int64_t T = config.seq_len;
  Batch first_windows{40, T, std::vector<int32_t>(40 * T), std::vector<int32_t>(40 * T)};
  std::vector<int32_t> stream(40 * T + 1);
  corpus->segments()[0].read(0, stream, corpus->vocab_size());
  for (int64_t i = 0; i < 40 * T; ++i) {
    first_windows.tokens[static_cast<size_t>(i)] = stream[static_cast<size_t>(i)];
    first_windows.targets[static_cast<size_t>(i)] = stream[static_cast<size_t>(i + 1)];
  }
  StepContext ctx{*be, policy, nullptr, {}};
  const double direct = mean_loss(*be, model.forward(ctx, upload(first_windows, *be), 0.0f)) *
                        static_cast<double>(40 * T);
  EXPECT_NEAR(direct / whole, 1.0, 1e-6);
  for (int world : {2, 3, 7}) {
    for (int64_t micro_batch : {1, 3, 8}) {
      double sum = 0.0;
      for (int rank = 0; rank < world; ++rank) {
        const Evaluator slice(corpus, config.seq_len, eval_tokens, micro_batch, world, rank);
        EXPECT_EQ(slice.tokens(), eval_tokens);
        sum += slice.local_loss_sum(model, *be, policy).value();
      }
      // A token lost or counted twice moves the sum by about 1/640; a different micro-batch
      // gives OpenBLAS's sgemm other row blocks, whose per-token FP32 losses can differ in the
      // last bit (1.9e-9 of the sum measured on an AVX2-only AMD EPYC).
      EXPECT_NEAR(sum / whole, 1.0, 1e-6) << world << " ranks, micro-batch " << micro_batch;
    }
  }
}

// BLOCKWISE scales the inputs of its GEMMs in 1x128 tiles, whose rows (tokens) cuBLASLt takes
// in multiples of 8 only (core::scale_rows_multiple); with seq_len 6 a forward takes a multiple
// of 4 windows. Ranks' slices and a last micro-batch of other sizes would each stop at the
// first GEMM.
TEST(Evaluator, BlockScaledFp8TakesWholeGroupsOfWindows) {
  auto be = core::make_cpu_backend();
  const PrecisionPolicy policy = PrecisionPolicy::from_mode(PrecisionMode::kFP8Hybrid);
  core::Fp8ScalingConfig fp8;
  fp8.recipe = core::Fp8Recipe::kBlockwise;
  fp8.grad_format = core::DType::kE4M3;
  const models::GPT2Config config{1, 2, 128, 6, 256};
  models::GPT2 model(config, *be, policy, 7, fp8);
  auto corpus = std::make_shared<const Corpus>(Corpus::synthetic_validation(1, 500));
  const int64_t multiple = core::scale_rows_multiple(core::ScaleMode::kVec128);
  ASSERT_EQ(multiple, 8);
  const int64_t eval_tokens = 27 * config.seq_len;  // 27 windows asked for: 24 evaluated

  const Evaluator one(corpus, config.seq_len, eval_tokens, 4, 1, 0, multiple);
  EXPECT_EQ(one.tokens(), 24 * config.seq_len);
  const double whole = one.local_loss_sum(model, *be, policy).value();
  for (int world : {2, 3, 5}) {
    for (int64_t micro_batch : {2, 4, 6}) {
      double sum = 0.0;
      for (int rank = 0; rank < world; ++rank) {
        const Evaluator slice(corpus, config.seq_len, eval_tokens, micro_batch, world, rank,
                              multiple);
        EXPECT_EQ(slice.tokens(), one.tokens());
        sum += slice.local_loss_sum(model, *be, policy).value();
      }
      // Each token's loss is computed from the same quantised blocks wherever its window
      // lands: only the last bits of the GEMMs' FP32 sums may differ.
      EXPECT_NEAR(sum / whole, 1.0, 1e-6) << world << " ranks, micro-batch " << micro_batch;
    }
  }
  // One window asked for: one group (four windows) is evaluated.
  EXPECT_EQ(Evaluator(corpus, config.seq_len, config.seq_len, 4, 1, 0, multiple).tokens(),
            4 * config.seq_len);
}

TEST(Evaluator, ReportsEachMicroBatchAndCanBeAbandoned) {
  auto be = core::make_cpu_backend();
  const PrecisionPolicy policy = PrecisionPolicy::from_mode(PrecisionMode::kFP32);
  const models::GPT2Config config{1, 2, 32, 16, 256};
  models::GPT2 model(config, *be, policy, 7);
  auto corpus = std::make_shared<const Corpus>(Corpus::synthetic_validation(1, 5000));
  // 10 windows in micro-batches of 3: 3 + 3 + 3 + 1.
  const Evaluator evaluator(corpus, config.seq_len, 10 * config.seq_len, 3, 1, 0);

  std::vector<std::pair<int64_t, int64_t>> seen;
  const std::optional<double> whole =
      evaluator.local_loss_sum(model, *be, policy, [&](int64_t done, int64_t total) {
        seen.emplace_back(done, total);
        return true;
      });
  ASSERT_TRUE(whole.has_value());
  EXPECT_EQ(*whole, evaluator.local_loss_sum(model, *be, policy).value());
  const std::vector<std::pair<int64_t, int64_t>> every{{1, 4}, {2, 4}, {3, 4}, {4, 4}};
  EXPECT_EQ(seen, every);

  seen.clear();
  const std::optional<double> cut =
      evaluator.local_loss_sum(model, *be, policy, [&](int64_t done, int64_t total) {
        seen.emplace_back(done, total);
        return done < 2;
      });
  EXPECT_FALSE(cut.has_value());
  const std::vector<std::pair<int64_t, int64_t>> two{{1, 4}, {2, 4}};
  EXPECT_EQ(seen, two) << "nothing runs after the callback says stop";
}

TEST(Evaluator, EveryRankReportsAsOftenSoTheCallbackMayHoldACollective) {
  auto be = core::make_cpu_backend();
  const PrecisionPolicy policy = PrecisionPolicy::from_mode(PrecisionMode::kFP32);
  const models::GPT2Config config{1, 2, 32, 16, 256};
  models::GPT2 model(config, *be, policy, 7);
  auto corpus = std::make_shared<const Corpus>(Corpus::synthetic_validation(1, 5000));
  for (const int64_t windows : {2, 10, 11}) {
    for (const int world : {1, 2, 3, 4}) {
      for (const int64_t micro_batch : {1, 3}) {
        // The most micro-batches of any rank's slice, by enumerating the slices.
        int64_t most = 0;
        for (int rank = 0; rank < world; ++rank) {
          const int64_t slice = windows * (rank + 1) / world - windows * rank / world;
          most = std::max(most, (slice + micro_batch - 1) / micro_batch);
        }
        for (int rank = 0; rank < world; ++rank) {
          const Evaluator evaluator(corpus, config.seq_len, windows * config.seq_len, micro_batch,
                                    world, rank);
          int64_t calls = 0;
          evaluator.local_loss_sum(model, *be, policy, [&](int64_t done, int64_t total) {
            EXPECT_EQ(done, ++calls);
            EXPECT_EQ(total, most);
            return true;
          });
          EXPECT_EQ(calls, most) << windows << " windows, rank " << rank << " of " << world
                                 << ", micro-batch " << micro_batch;
        }
      }
    }
  }
}

TEST(Evaluator, TooShortAValidationSetIsAConfigError) {
  auto corpus = std::make_shared<const Corpus>(Corpus::synthetic_validation(1, 16));
  try {
    Evaluator(corpus, 16, 1024, 4, 1, 0);
    FAIL() << "expected a ConfigError";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no whole window of seq_len + 1 = 17 tokens"),
              std::string::npos)
        << e.what();
  }
  // 2 windows of 7 tokens, and a model that takes a multiple of 4 tokens: groups of 4 windows.
  auto two_windows = std::make_shared<const Corpus>(Corpus::synthetic_validation(1, 15));
  try {
    Evaluator(two_windows, 7, 1024, 4, 1, 0, 4);
    FAIL() << "expected a ConfigError";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(
        std::string(e.what()).find("15 tokens hold 2 whole windows of seq_len + 1 = 8 tokens, "
                                   "and this model evaluates them in groups of 4"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace mantissa::train
