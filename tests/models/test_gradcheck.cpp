// Every parameter gradient of a tiny GPT-2, a tiny Llama (grouped-query and plain multi-head,
// tied and untied) and the MLP against central finite differences of the loss, in FP32, every
// element of every tensor, through the materialised attention and (GPT-2 and the grouped-query
// Llama) through flash attention, which the CPU runs only when asked; and
// GPT-2's padded vocabulary (gpt2.h), whose loss and gradients must be those of the unpadded
// model.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "models/mlp/mlp.h"
#include "tests/common/test_util.h"

namespace mantissa::models {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

// Tokens and next-token targets drawn from a fixed hash, [B, T] on the CPU.
train::BatchTensors make_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  train::BatchTensors batch{Tensor::empty(Shape{b, t}, DType::kI32),
                            Tensor::empty(Shape{b, t}, DType::kI32)};
  for (int64_t i = 0; i < b * t; ++i) {
    batch.tokens.data_as<int32_t>()[i] =
        static_cast<int32_t>(core::random_u32(seed, 2 * i) % vocab);
    batch.targets.data_as<int32_t>()[i] =
        static_cast<int32_t>(core::random_u32(seed, 2 * i + 1) % vocab);
  }
  return batch;
}

// Replaces the masters with N(0, std) values: GPT-2's 0.02 initialisation makes most
// gradients too small for FP32 finite differences to resolve.
void randomise_masters(train::ParameterStore& params, core::Backend& be, float std, uint64_t seed) {
  Tensor& masters = params.masters();
  for (const train::Parameter& p : params.all()) {
    float* w = masters.data_as<float>() + p.offset;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double u1 = (core::random_u32(seed + p.offset, 2 * i) + 1.0) / 4294967297.0;
      const double u2 = core::random_u32(seed + p.offset, 2 * i + 1) / 4294967296.0;
      w[i] = static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307 * u2));
    }
  }
  params.refresh_compute_copy(be);
}

// Gradients here are 1e-4..1e-1. A central difference with step h is off by about h^2 f'''/6
// (0.3% at h = 1e-2 for an RMSNorm gain of the Llama below), and the FP32 loss's rounding
// makes one noisy, by about 1e-7 / h, at smaller steps. Richardson's extrapolation from the
// steps 2h and h, h = 2e-2, cancels the h^2 term and keeps the noise near 1e-5: the tolerance.
// Checks every element of every parameter tensor, except that
// a parameter named in `leading` is checked over its first that many elements, and its last
// element checked besides (GPT-2's wte: the real rows, then one element of the padding).
void check_gradients(train::LanguageModel& model, core::Backend& be,
                     const train::BatchTensors& batch,
                     const std::map<std::string, int64_t>& leading = {}) {
  const core::PrecisionPolicy policy = core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32);
  train::StepContext ctx{be, policy, nullptr, {}};
  train::ParameterStore& params = model.parameters();
  params.zero_grad(be);
  const int64_t tokens = batch.tokens.numel();
  model.forward(ctx, batch, 1.0f / static_cast<float>(tokens));
  model.backward(ctx);
  const std::vector<float> grads(params.grads().data_as<float>(),
                                 params.grads().data_as<float>() + params.flat_numel());

  float* masters = params.masters().data_as<float>();
  // (loss(w_i + h) - loss(w_i - h)) / (the step the FP32 masters really took).
  const auto central_difference = [&](int64_t i, float h) {
    const float saved = masters[i];
    const float up = saved + h, down = saved - h;
    masters[i] = up;
    params.refresh_compute_copy(be);
    const double loss_up = train::mean_loss(be, model.forward(ctx, batch, 0.0f));
    masters[i] = down;
    params.refresh_compute_copy(be);
    const double loss_down = train::mean_loss(be, model.forward(ctx, batch, 0.0f));
    masters[i] = saved;
    return (loss_up - loss_down) / (static_cast<double>(up) - static_cast<double>(down));
  };
  for (const train::Parameter& p : params.all()) {
    const auto found = leading.find(p.spec.name);
    const int64_t n = found == leading.end() ? p.numel() : found->second;
    std::vector<int64_t> elements;
    for (int64_t e = 0; e < n; ++e) elements.push_back(e);
    if (n < p.numel()) elements.push_back(p.numel() - 1);
    for (const int64_t element : elements) {
      const int64_t i = p.offset + element;
      const double numeric =
          (4.0 * central_difference(i, 2e-2f) - central_difference(i, 4e-2f)) / 3.0;
      const double analytic = grads[static_cast<size_t>(i)];
      EXPECT_NEAR(analytic, numeric, 1e-5 + 1e-3 * std::fabs(numeric))
          << p.spec.name << " element " << i - p.offset;
    }
  }
  params.refresh_compute_copy(be);
}

// 13 tokens, which the model pads to 128: the logits have 115 padding columns, outside the
// loss. wte is sampled over its 13 real rows, and one padding element (randomised here like
// every master) must show no gradient either way.
void check_tiny_gpt2() {
  auto be = core::make_cpu_backend();
  const GPT2Config config{2, 2, 8, 6, 13};
  ASSERT_EQ(config.padded_vocab_size(), 128);
  GPT2 model(config, *be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 7);
  randomise_masters(model.parameters(), *be, 0.3f, 11);
  check_gradients(model, *be, make_batch(2, 5, config.vocab_size, 3),
                  {{"wte", config.vocab_size * config.n_embd}});
}

TEST(Gradcheck, TinyGPT2EveryParameterTensor) {
  check_tiny_gpt2();
}

TEST(Gradcheck, TinyGPT2WithFlashAttention) {
  core::ScopedEnv flash("MANTISSA_FLASH_ATTENTION", "1");
  check_tiny_gpt2();
}

// Llama with 4 query heads sharing 2 key/value heads (head dimension 4, RoPE over positions
// 0..4 with a small base so that the angles differ visibly), an untied head, 13 tokens padded
// to 128 rows in both the embedding and the head.
void check_tiny_llama_grouped_query() {
  auto be = core::make_cpu_backend();
  LlamaConfig config;
  config.n_layer = 2;
  config.n_head = 4;
  config.n_kv_head = 2;
  config.n_embd = 16;
  config.ffn_hidden = 12;
  config.seq_len = 6;
  config.vocab_size = 13;
  config.rope_theta = 3.0;
  Llama model(config, *be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 7);
  randomise_masters(model.parameters(), *be, 0.3f, 11);
  const int64_t real = config.vocab_size * config.n_embd;
  check_gradients(model, *be, make_batch(2, 5, config.vocab_size, 3),
                  {{"embed_tokens.weight", real}, {"lm_head.weight", real}});
}

TEST(Gradcheck, TinyLlamaGroupedQueryEveryParameterTensor) {
  check_tiny_llama_grouped_query();
}

TEST(Gradcheck, TinyLlamaGroupedQueryWithFlashAttention) {
  core::ScopedEnv flash("MANTISSA_FLASH_ATTENTION", "1");
  check_tiny_llama_grouped_query();
}

// Plain multi-head attention (no repeat of key/value heads) with the head tied to the
// embedding, whose gradient then sums the two uses.
TEST(Gradcheck, TinyLlamaTiedMultiHeadEveryParameterTensor) {
  auto be = core::make_cpu_backend();
  LlamaConfig config;
  config.n_layer = 1;
  config.n_head = 2;
  config.n_kv_head = 2;
  config.n_embd = 8;
  config.ffn_hidden = 10;
  config.seq_len = 5;
  config.vocab_size = 11;
  config.tie_embeddings = true;
  Llama model(config, *be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 5);
  for (const train::Parameter& p : model.parameters().all()) {
    EXPECT_NE(p.spec.name, "lm_head.weight") << "a tied head has no parameter of its own";
  }
  randomise_masters(model.parameters(), *be, 0.3f, 17);
  check_gradients(model, *be, make_batch(3, 4, config.vocab_size, 5),
                  {{"embed_tokens.weight", config.vocab_size * config.n_embd}});
}

TEST(Gradcheck, MLPEveryParameterTensor) {
  auto be = core::make_cpu_backend();
  const MLPConfig config{6, 10, 5, 9};
  MLP model(config, *be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 5);
  randomise_masters(model.parameters(), *be, 0.3f, 13);
  check_gradients(model, *be, make_batch(3, 4, config.vocab_size, 9));
}

// ---------------------------------------------------------------------------------------
// The padded vocabulary: 200 tokens in 256 rows of wte.

constexpr int64_t kVocab = 200, kPaddedVocab = 256, kChannels = 8;
const GPT2Config kPaddedConfig{2, 2, kChannels, 6, kVocab};

// The loss of a forward and backward pass, and the whole flat gradient buffer after it.
struct Pass {
  double loss;
  std::vector<float> grads;
};

Pass forward_backward(GPT2& model, core::Backend& be, core::PrecisionMode mode,
                      const train::BatchTensors& batch) {
  train::StepContext ctx{be, core::PrecisionPolicy::from_mode(mode), nullptr, {}};
  train::ParameterStore& params = model.parameters();
  params.zero_grad(be);
  const double loss = train::mean_loss(
      be, model.forward(ctx, batch, 1.0f / static_cast<float>(batch.tokens.numel())));
  model.backward(ctx);
  const float* g = params.grads().data_as<float>();
  return {loss, std::vector<float>(g, g + params.flat_numel())};
}

// The padding rows start at zero, in the masters and the compute copy; the real rows hold
// what an unpadded wte holds (256 tokens need no padding: its first 200 rows).
TEST(PaddedVocabulary, PaddingRowsOfWteStartAtZero) {
  auto be = core::make_cpu_backend();
  const auto policy = core::PrecisionPolicy::from_mode(core::PrecisionMode::kBF16);
  GPT2 model(kPaddedConfig, *be, policy, 7);
  GPT2Config unpadded_config = kPaddedConfig;
  unpadded_config.vocab_size = kPaddedVocab;
  GPT2 unpadded(unpadded_config, *be, policy, 7);
  const train::Parameter& wte = model.parameters()[0];
  const train::Parameter& unpadded_wte = unpadded.parameters()[0];
  ASSERT_EQ(wte.spec.name, "wte");
  ASSERT_EQ(wte.spec.shape, Shape({kPaddedVocab, kChannels}));
  ASSERT_EQ(unpadded_wte.spec.shape, wte.spec.shape);
  // The model's own parameters leave the padding out (the start line and MFU count them).
  const int64_t padding = (kPaddedVocab - kPaddedConfig.vocab_size) * kChannels;
  EXPECT_EQ(model.parameter_count(), model.parameters().parameter_count() - padding);
  EXPECT_EQ(unpadded.parameter_count(), unpadded.parameters().parameter_count());
  const float* master = wte.master.data_as<float>();
  const auto* compute = wte.compute.data_as<core::bf16>();
  const float* unpadded_master = unpadded_wte.master.data_as<float>();
  for (int64_t i = 0; i < wte.numel(); ++i) {
    const float expected = i < kVocab * kChannels ? unpadded_master[i] : 0.0f;
    ASSERT_EQ(master[i], expected) << "element " << i;
    ASSERT_EQ(core::bf16_to_float(compute[i]), core::bf16_to_float(core::bf16_from_float(expected)))
        << "element " << i;
  }
}

// Under ZeRO-1 a rank keeps one range of the masters, which may start or end inside the
// padding: every rank's range equals the same range of a whole store's.
TEST(PaddedVocabulary, EveryZero1ShardHasTheSameWeights) {
  auto be = core::make_cpu_backend();
  const auto policy = core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32);
  GPT2 whole(kPaddedConfig, *be, policy, 7);
  const float* all = whole.parameters().masters().data_as<float>();
  for (int world : {2, 3, 7}) {
    for (int rank = 0; rank < world; ++rank) {
      GPT2 sharded(kPaddedConfig, *be, policy, 7, {}, train::MasterShard{rank, world});
      train::ParameterStore& params = sharded.parameters();
      const float* kept = params.masters().data_as<float>();
      for (int64_t i = 0; i < params.masters().numel(); ++i)
        ASSERT_EQ(kept[i], all[params.masters_begin() + i])
            << "rank " << rank << " of " << world << ", flat element "
            << params.masters_begin() + i;
      EXPECT_EQ(std::memcmp(params.compute().data(), whole.parameters().compute().data(),
                            params.compute().nbytes()),
                0)
          << "compute copy, rank " << rank << " of " << world;
    }
  }
}

// The unpadded reference by construction: with wte all zero every logit is 0, so each
// token's loss is log(200) exactly as the FP32 op computes it (a sum of 200 ones), where a
// softmax over the padded 256 columns would give log(256).
TEST(PaddedVocabulary, LossIsOverTheTrueVocabulary) {
  auto be = core::make_cpu_backend();
  GPT2 model(kPaddedConfig, *be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 7);
  train::ParameterStore& params = model.parameters();
  const train::Parameter& wte = params[0];
  std::fill(wte.master.data_as<float>(), wte.master.data_as<float>() + wte.numel(), 0.0f);
  params.refresh_compute_copy(*be);
  const Pass pass =
      forward_backward(model, *be, core::PrecisionMode::kFP32, make_batch(2, 5, kVocab, 3));
  EXPECT_EQ(pass.loss, static_cast<double>(std::log(static_cast<float>(kVocab))));
}

// Loss and every gradient bit for bit the same whatever the padding rows of wte hold: their
// logits are outside the softmax, their gradient is exactly zero, and what they add to the
// hidden states' gradient is exactly zero (0 x w). So the padded model's loss and gradients
// are the unpadded model's, in FP32 and in BF16.
TEST(PaddedVocabulary, PaddingRowsChangeNoBitOfTheLossOrTheGradients) {
  auto be = core::make_cpu_backend();
  for (core::PrecisionMode mode : {core::PrecisionMode::kFP32, core::PrecisionMode::kBF16}) {
    const std::string what = core::precision_mode_name(mode);
    GPT2 model(kPaddedConfig, *be, core::PrecisionPolicy::from_mode(mode), 7);
    train::ParameterStore& params = model.parameters();
    randomise_masters(params, *be, 0.3f, 11);
    const train::Parameter& wte = params[0];
    float* padding = wte.master.data_as<float>() + kVocab * kChannels;
    const int64_t padding_count = wte.numel() - kVocab * kChannels;
    std::fill(padding, padding + padding_count, 0.0f);
    params.refresh_compute_copy(*be);
    const train::BatchTensors batch = make_batch(2, 5, kVocab, 3);
    const Pass zero_padding = forward_backward(model, *be, mode, batch);
    for (int64_t i = 0; i < padding_count; ++i)
      ASSERT_EQ(zero_padding.grads[static_cast<size_t>(wte.offset + kVocab * kChannels + i)], 0.0f)
          << what << ": gradient of padding element " << i;

    // Large values of both signs: logits far above the real ones, were they in the softmax.
    for (int64_t i = 0; i < padding_count; ++i)
      padding[i] = static_cast<float>((i % 7) - 3) * 100.0f;
    params.refresh_compute_copy(*be);
    const Pass junk_padding = forward_backward(model, *be, mode, batch);
    EXPECT_EQ(std::memcmp(&junk_padding.loss, &zero_padding.loss, sizeof(double)), 0)
        << what << ": loss " << junk_padding.loss << " vs " << zero_padding.loss;
    ASSERT_EQ(junk_padding.grads.size(), zero_padding.grads.size());
    EXPECT_EQ(std::memcmp(junk_padding.grads.data(), zero_padding.grads.data(),
                          zero_padding.grads.size() * sizeof(float)),
              0)
        << what << ": gradients differ";
  }
}

}  // namespace
}  // namespace mantissa::models
