// LanguageModel::logits (train/language_model.h) of every model: F32 [B*T, padded vocab], the
// very logits forward() takes its loss from (the mean cross-entropy recomputed from them in
// FP64 over the first vocab_size columns equals forward's), the GPT-2 and Llama padding
// columns exactly zero (their padding rows are), the MLP's widened from BF16 when it computes
// in BF16, and no backward pass after it. (The logits' values against independent PyTorch
// models: hf_reference.py.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "core/error.h"
#include "core/precision/policy.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "models/mlp/mlp.h"

using namespace mantissa;

namespace {

constexpr int64_t kB = 2, kT = 8, kVocab = 200;

struct Batch {
  std::vector<int32_t> tokens, targets;
  train::BatchTensors tensors;
  Batch() {
    for (int64_t i = 0; i < kB * kT; ++i) {
      tokens.push_back(static_cast<int32_t>((i * 37 + 11) % kVocab));
      targets.push_back(static_cast<int32_t>((i * 53 + 5) % kVocab));
    }
    tensors = {core::Tensor::wrap(tokens.data(), core::Shape{kB, kT}, core::DType::kI32),
               core::Tensor::wrap(targets.data(), core::Shape{kB, kT}, core::DType::kI32)};
  }
};

// The mean cross-entropy of the targets under the first kVocab columns, in FP64.
double loss_from(const core::Tensor& logits, const std::vector<int32_t>& targets) {
  const int64_t cols = logits.dim(1);
  double total = 0.0;
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    const float* row = logits.data_as<float>() + r * cols;
    double max = row[0], sum = 0.0;
    for (int64_t v = 0; v < kVocab; ++v) max = std::max<double>(max, row[v]);
    for (int64_t v = 0; v < kVocab; ++v) sum += std::exp(row[v] - max);
    total += max + std::log(sum) - row[targets[static_cast<size_t>(r)]];
  }
  return total / static_cast<double>(logits.dim(0));
}

void check(train::LanguageModel& model, core::Backend& backend, core::PrecisionMode mode,
           int64_t padded_vocab, bool zero_padding) {
  train::StepContext ctx{backend, core::PrecisionPolicy::from_mode(mode), nullptr, {}};
  Batch batch;
  // A training forward first: logits() must drop what it kept.
  model.forward(ctx, batch.tensors, 1.0f);
  const core::Tensor logits = model.logits(ctx, batch.tensors.tokens);
  EXPECT_THROW(model.backward(ctx), core::Error) << "backward after logits()";
  ASSERT_EQ(logits.dtype(), core::DType::kF32);
  ASSERT_EQ(logits.shape(), (core::Shape{kB * kT, padded_vocab}));
  const double loss = train::mean_loss(backend, model.forward(ctx, batch.tensors, 0.0f));
  EXPECT_NEAR(loss_from(logits, batch.targets), loss, 1e-6 * loss);
  if (zero_padding) {
    for (int64_t r = 0; r < logits.dim(0); ++r)
      for (int64_t v = kVocab; v < padded_vocab; ++v)
        ASSERT_EQ(logits.data_as<float>()[r * padded_vocab + v], 0.0f) << r << ", " << v;
  }
  // Deterministic: the same logits again.
  const core::Tensor again = model.logits(ctx, batch.tensors.tokens);
  EXPECT_EQ(std::memcmp(again.data(), logits.data(), logits.nbytes()), 0);
}

}  // namespace

TEST(Logits, Gpt2) {
  auto backend = core::make_cpu_backend();
  for (const core::PrecisionMode mode : {core::PrecisionMode::kFP32, core::PrecisionMode::kBF16}) {
    models::GPT2 model(
        {.n_layer = 2, .n_head = 2, .n_embd = 32, .seq_len = kT, .vocab_size = kVocab}, *backend,
        core::PrecisionPolicy::from_mode(mode), 3);
    check(model, *backend, mode, 256, true);
  }
}

TEST(Logits, Llama) {
  auto backend = core::make_cpu_backend();
  models::LlamaConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 32;
  c.ffn_hidden = 64;
  c.seq_len = kT;
  c.vocab_size = kVocab;
  for (const core::PrecisionMode mode : {core::PrecisionMode::kFP32, core::PrecisionMode::kBF16}) {
    models::Llama model(c, *backend, core::PrecisionPolicy::from_mode(mode), 3);
    check(model, *backend, mode, 256, true);
  }
}

TEST(Logits, Mlp) {
  auto backend = core::make_cpu_backend();
  for (const core::PrecisionMode mode : {core::PrecisionMode::kFP32, core::PrecisionMode::kBF16}) {
    models::MLP model({.n_embd = 16, .hidden = 32, .seq_len = kT, .vocab_size = kVocab}, *backend,
                      core::PrecisionPolicy::from_mode(mode), 3);
    check(model, *backend, mode, kVocab, false);
  }
}
