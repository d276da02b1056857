// Text generation on the CPU backend:
//  - attention_decode against attention_forward: each new row over the cache equals the full
//    causal attention's row at its position (FP32 tightly, BF16 caches within rounding), and
//    bad arguments are refused naming the operand;
//  - GPT2Decoder: the logits of the last position from the KV-cache path (a prompt filled at
//    once, then one token at a time) equal those of the full forward over the whole sequence
//    within a tight FP32 tolerance, and the full forward's loss is training's (GPT2::forward);
//  - LlamaDecoder (grouped-query attention, RoPE at the cached positions, an untied head): the
//    same, and its full forward's logits are the model's own (Llama::logits);
//  - generate(): greedy tokens equal those of re-running the full forward over the same
//    context, also after the window slides past seq_len; a seed repeats its tokens;
//  - TokenSampler: greedy, ties, top-k, top-p, excluded ids, the softmax distribution at a
//    temperature, seeds, and the options and logits it refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops/backend.h"
#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_decoder.h"
#include "models/llama/llama.h"
#include "models/llama/llama_decoder.h"
#include "models/sampling.h"
#include "tests/common/test_util.h"

namespace mantissa::models {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

// N(0, std) from the counter-based hash (Box-Muller), so the test is the same everywhere.
float normal(uint64_t seed, int64_t i, float std) {
  const double u1 = (core::random_u32(seed, 2 * i) + 1.0) / 4294967297.0;
  const double u2 = core::random_u32(seed, 2 * i + 1) / 4294967296.0;
  return static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307 * u2));
}

Tensor random_tensor(const Shape& shape, DType dtype, uint64_t seed, float std) {
  Tensor f32 = Tensor::empty(shape, DType::kF32);
  for (int64_t i = 0; i < f32.numel(); ++i) f32.data_as<float>()[i] = normal(seed, i, std);
  if (dtype == DType::kF32) return f32;
  Tensor t = Tensor::empty(shape, dtype);
  core::make_cpu_backend()->cast(f32, t, core::CastParams{});
  return t;
}

std::vector<float> as_floats(const Tensor& t) {
  Tensor f32 = Tensor::empty(t.shape(), DType::kF32);
  core::make_cpu_backend()->cast(t, f32, core::CastParams{});
  return {f32.data_as<float>(), f32.data_as<float>() + f32.numel()};
}

// max |a - b| over max(1, max |b|): the error relative to the size of the values.
double relative_error(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double diff = 0.0, scale = 1.0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    diff = core::worse_error(diff, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return diff / scale;
}

// ---------------------------------------------------------------------------------------
// attention_decode

struct DecodeCase {
  int64_t T, C;
  int n_head;
  DType dtype;
  int64_t first_chunk;  // rows run in the first call; the rest one at a time
  double tolerance;
};

TEST(AttentionDecode, RowsMatchFullCausalAttention) {
  auto be = core::make_cpu_backend();
  const DecodeCase cases[] = {
      {1, 4, 1, DType::kF32, 1, 1e-6},    {9, 12, 3, DType::kF32, 4, 1e-6},
      {40, 64, 2, DType::kF32, 1, 1e-6},  {33, 96, 4, DType::kF32, 33, 1e-6},
      {21, 48, 2, DType::kBF16, 5, 1e-2}, {17, 40, 5, DType::kF16, 3, 2e-3},
  };
  for (const DecodeCase& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " C=" + std::to_string(c.C) +
                 " H=" + std::to_string(c.n_head) + " " + core::dtype_name(c.dtype));
    const Tensor qkv = random_tensor(Shape{c.T, 3 * c.C}, c.dtype, c.T * 1000 + c.C, 1.5f);
    Tensor full = Tensor::empty(Shape{1, c.T, c.C}, c.dtype);
    Tensor att = Tensor::empty(Shape{1, c.n_head, c.T, c.T}, DType::kF32);
    be->attention_forward(qkv.reshape(Shape{1, c.T, 3 * c.C}), full, att, c.n_head);

    // Caches longer than needed, poisoned past what is written: nothing beyond the visible
    // positions may be read.
    Tensor k_cache = Tensor::empty(Shape{c.T + 3, c.C}, c.dtype);
    Tensor v_cache = Tensor::empty(Shape{c.T + 3, c.C}, c.dtype);
    be->fill(k_cache, NAN);
    be->fill(v_cache, NAN);
    Tensor decoded = Tensor::empty(Shape{c.T, c.C}, c.dtype);
    for (int64_t start = 0; start < c.T;) {
      const int64_t n = start == 0 ? c.first_chunk : 1;
      Tensor out = decoded.view(start * c.C, Shape{n, c.C});
      be->attention_decode(qkv.view(start * 3 * c.C, Shape{n, 3 * c.C}), k_cache, v_cache, out,
                           c.n_head, start);
      start += n;
    }
    EXPECT_LE(relative_error(as_floats(decoded), as_floats(full)), c.tolerance);
    // The caches hold the K and V of every row, exactly (same dtype).
    const std::vector<float> q = as_floats(qkv), k = as_floats(k_cache), v = as_floats(v_cache);
    for (int64_t t = 0; t < c.T; ++t) {
      for (int64_t ch = 0; ch < c.C; ++ch) {
        ASSERT_EQ(k[t * c.C + ch], q[t * 3 * c.C + c.C + ch]);
        ASSERT_EQ(v[t * c.C + ch], q[t * 3 * c.C + 2 * c.C + ch]);
      }
    }
  }
}

void expect_error(const std::function<void()>& call, const std::string& words) {
  try {
    call();
    ADD_FAILURE() << "expected an error mentioning: " << words;
  } catch (const core::Error& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

TEST(AttentionDecode, RefusesBadArguments) {
  auto be = core::make_cpu_backend();
  Tensor qkv = Tensor::empty(Shape{2, 12}, DType::kF32);
  Tensor k = Tensor::empty(Shape{4, 4}, DType::kF32), v = Tensor::empty(Shape{4, 4}, DType::kF32);
  Tensor out = Tensor::empty(Shape{2, 4}, DType::kF32);
  be->fill(qkv, 0.0f);
  expect_error([&] { be->attention_decode(qkv, k, v, out, 2, 3); },
               "attention_decode: positions [3, 5) of qkv");
  expect_error([&] { be->attention_decode(qkv, k, v, out, 2, -1); }, "start must be >= 0");
  expect_error([&] { be->attention_decode(qkv, k, v, out, 3, 0); }, "not divisible by n_head = 3");
  Tensor wide = Tensor::empty(Shape{4, 8}, DType::kF32);
  expect_error([&] { be->attention_decode(qkv, wide, v, out, 2, 0); },
               "operand k_cache f32[4, 8] on cpu must have 4 channels");
  Tensor short_v = Tensor::empty(Shape{3, 4}, DType::kF32);
  expect_error([&] { be->attention_decode(qkv, k, short_v, out, 2, 0); }, "same shape");
  Tensor wrong_out = Tensor::empty(Shape{1, 4}, DType::kF32);
  expect_error([&] { be->attention_decode(qkv, k, v, wrong_out, 2, 0); }, "operand out");
  Tensor i32 = Tensor::empty(Shape{4, 4}, DType::kI32);
  expect_error([&] { be->attention_decode(qkv, i32, v, out, 2, 0); }, "k_cache");
  Tensor aliased = k.view(0, Shape{2, 4});
  expect_error([&] { be->attention_decode(qkv, k, v, aliased, 2, 0); }, "overlaps");
}

// ---------------------------------------------------------------------------------------
// GPT2Decoder

// A small GPT-2 in FP32 with N(0, 0.1) weights (GPT-2's 0.02 initialisation gives logits too
// close to each other to tell a wrong attention from a right one). vocab_size 300 pads wte to
// 384 rows, which the decoder must not sample.
void set_normal_weights(train::ParameterStore& params, core::Backend& be) {
  Tensor weights = Tensor::empty(Shape{params.flat_numel()}, DType::kF32);
  be.fill(weights, 0.0f);
  for (const train::Parameter& p : params.all()) {
    for (int64_t i = 0; i < p.numel(); ++i) {
      weights.data_as<float>()[p.offset + i] = normal(11 + p.offset, i, 0.1f);
    }
  }
  params.set_weights(be, weights);
}

struct TinyModel {
  std::unique_ptr<core::Backend> be = core::make_cpu_backend();
  GPT2Config config{2, 3, 48, 32, 300};
  GPT2 model{config, *be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 7};

  TinyModel() { set_normal_weights(model.parameters(), *be); }
};

std::vector<int32_t> random_tokens(int64_t n, int64_t vocab, uint64_t seed) {
  std::vector<int32_t> tokens(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    tokens[static_cast<size_t>(i)] = static_cast<int32_t>(core::random_u32(seed, i) % vocab);
  }
  return tokens;
}

std::vector<float> host_floats(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  std::memcpy(out.data(), t.data(), t.nbytes());
  return out;
}

// Row `row` of full logits [T, V].
std::vector<float> row_of(const Tensor& logits, int64_t row) {
  const int64_t v = logits.dim(1);
  return host_floats(logits.view(row * v, Shape{v}));
}

TEST(GPT2Decoder, CachedLogitsEqualTheFullForward) {
  TinyModel m;
  GPT2Decoder decoder(m.model, *m.be);
  EXPECT_EQ(decoder.capacity(), 32);
  EXPECT_EQ(decoder.vocab_size(), 300);
  const std::vector<int32_t> tokens = random_tokens(32, 300, 5);
  const Tensor full = decoder.full_logits(tokens);
  ASSERT_EQ(full.shape(), (Shape{32, 300}));

  // A prompt of 7 at once, then one token at a time up to the full window.
  const Tensor prompt_logits = decoder.append(std::span(tokens).first(7));
  EXPECT_EQ(decoder.length(), 7);
  EXPECT_LE(relative_error(host_floats(prompt_logits), row_of(full, 6)), 1e-5);
  for (int64_t t = 7; t < 32; ++t) {
    const Tensor logits = decoder.append(std::span(tokens).subspan(static_cast<size_t>(t), 1));
    EXPECT_LE(relative_error(host_floats(logits), row_of(full, t)), 1e-5) << "position " << t;
  }
  EXPECT_EQ(decoder.length(), 32);
  // The full forward over a prefix gives that prefix's rows: causal, as the cache assumes.
  const Tensor prefix = decoder.full_logits(std::span(tokens).first(10));
  EXPECT_LE(relative_error(row_of(prefix, 9), row_of(full, 9)), 1e-6);

  expect_error([&] { decoder.append(std::span(tokens).first(1)); },
               "1 tokens at position 32 do not fit the window of seq_len 32");
  decoder.clear();
  EXPECT_EQ(decoder.length(), 0);
  const Tensor again = decoder.append(tokens);
  EXPECT_LE(relative_error(host_floats(again), row_of(full, 31)), 1e-5);
}

TEST(GPT2Decoder, FullForwardLossIsTrainingsLoss) {
  TinyModel m;
  GPT2Decoder decoder(m.model, *m.be);
  const std::vector<int32_t> all = random_tokens(25, 300, 9);
  const std::span<const int32_t> tokens = std::span(all).first(24);
  const Tensor logits = decoder.full_logits(tokens);
  double sum = 0.0;
  for (int64_t t = 0; t < 24; ++t) {
    const std::vector<float> row = row_of(logits, t);
    const double max = *std::max_element(row.begin(), row.end());
    double exp_sum = 0.0;
    for (const float z : row) exp_sum += std::exp(z - max);
    sum += max + std::log(exp_sum) - row[static_cast<size_t>(all[static_cast<size_t>(t) + 1])];
  }

  train::BatchTensors batch{Tensor::empty(Shape{1, 24}, DType::kI32),
                            Tensor::empty(Shape{1, 24}, DType::kI32)};
  std::memcpy(batch.tokens.data(), all.data(), 24 * sizeof(int32_t));
  std::memcpy(batch.targets.data(), all.data() + 1, 24 * sizeof(int32_t));
  train::StepContext ctx{
      *m.be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), nullptr, {}};
  const double training_loss = train::mean_loss(*m.be, m.model.forward(ctx, batch, 0.0f));
  EXPECT_NEAR(sum / 24.0, training_loss, 1e-5 * training_loss);
}

// ---------------------------------------------------------------------------------------
// LlamaDecoder

// 4 query heads sharing 2 key/value heads of 8 channels, an untied head, vocab 300 in 384 rows.
struct TinyLlama {
  static LlamaConfig config() {
    LlamaConfig c;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 2;
    c.n_embd = 32;
    c.ffn_hidden = 48;
    c.seq_len = 32;
    c.vocab_size = 300;
    return c;
  }
  std::unique_ptr<core::Backend> be = core::make_cpu_backend();
  Llama model{config(), *be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 7};

  TinyLlama() { set_normal_weights(model.parameters(), *be); }
};

TEST(LlamaDecoder, CachedLogitsEqualTheFullForward) {
  TinyLlama m;
  LlamaDecoder decoder(m.model, *m.be);
  EXPECT_EQ(decoder.capacity(), 32);
  EXPECT_EQ(decoder.vocab_size(), 300);
  const std::vector<int32_t> tokens = random_tokens(32, 300, 6);
  const Tensor full = decoder.full_logits(tokens);
  ASSERT_EQ(full.shape(), (Shape{32, 300}));

  // A prompt of 5 at once, then one token at a time: each new key rotated at its position.
  const Tensor prompt_logits = decoder.append(std::span(tokens).first(5));
  EXPECT_LE(relative_error(host_floats(prompt_logits), row_of(full, 4)), 1e-5);
  for (int64_t t = 5; t < 32; ++t) {
    const Tensor logits = decoder.append(std::span(tokens).subspan(static_cast<size_t>(t), 1));
    EXPECT_LE(relative_error(host_floats(logits), row_of(full, t)), 1e-5) << "position " << t;
  }
  expect_error([&] { decoder.append(std::span(tokens).first(1)); },
               "1 tokens at position 32 do not fit the window of seq_len 32");
}

TEST(LlamaDecoder, FullForwardLogitsAreTheModels) {
  TinyLlama m;
  LlamaDecoder decoder(m.model, *m.be);
  const std::vector<int32_t> tokens = random_tokens(20, 300, 8);
  const Tensor decoded = decoder.full_logits(tokens);
  Tensor batch = Tensor::empty(Shape{1, 20}, DType::kI32);
  std::memcpy(batch.data(), tokens.data(), 20 * sizeof(int32_t));
  train::StepContext ctx{
      *m.be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), nullptr, {}};
  const Tensor model_logits = m.model.logits(ctx, batch);
  ASSERT_EQ(model_logits.shape(), (Shape{20, 384}));  // the padded head
  for (int64_t t = 0; t < 20; ++t) {
    const std::vector<float> padded = host_floats(model_logits.view(t * 384, Shape{300}));
    EXPECT_LE(relative_error(row_of(decoded, t), padded), 1e-6) << "position " << t;
  }
}

// generate()'s rule, recomputed with the full forward: the context is the last `window` prompt
// tokens, and when it is full it becomes its last window / 2 - 1 tokens plus the new one.
std::vector<int32_t> greedy_by_full_forward(GPT2Decoder& decoder, std::vector<int32_t> context,
                                            int64_t n, int64_t vocab_limit) {
  const int64_t window = decoder.capacity();
  if (std::ssize(context) > window) context.erase(context.begin(), context.end() - window);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const Tensor logits = decoder.full_logits(context);
    const std::vector<float> row = row_of(logits, std::ssize(context) - 1);
    const auto best = std::max_element(row.begin(), row.begin() + vocab_limit) - row.begin();
    out.push_back(static_cast<int32_t>(best));
    if (std::ssize(context) == window)
      context.erase(context.begin(), context.end() - (window / 2 - 1));
    context.push_back(static_cast<int32_t>(best));
  }
  return out;
}

TEST(Generate, GreedyTokensEqualTheFullForwardAcrossWindowSlides) {
  TinyModel m;
  GPT2Decoder decoder(m.model, *m.be);
  TokenSampler greedy(SamplingOptions{0.0, 0, 1});
  // A prompt longer than the window keeps its last 32 tokens; 60 new tokens slide the window
  // three times (every 16 tokens once it is full).
  const std::vector<int32_t> prompt = random_tokens(40, 300, 12);
  const std::vector<int32_t> generated = generate(decoder, prompt, 60, greedy, 256);
  ASSERT_EQ(generated.size(), 60u);
  EXPECT_EQ(generated, greedy_by_full_forward(decoder, prompt, 60, 256));
  for (const int32_t t : generated) EXPECT_LT(t, 256);

  // A short prompt fills the window first.
  const std::vector<int32_t> short_prompt = {3};
  EXPECT_EQ(generate(decoder, short_prompt, 50, greedy, 300),
            greedy_by_full_forward(decoder, short_prompt, 50, 300));
  EXPECT_TRUE(generate(decoder, short_prompt, 0, greedy, 300).empty());
  // A stop token ends generation once drawn (the tokens up to it and it), as end of text does
  // for `mantissa sample --end-of-text stop`.
  const int32_t stop = generated[20];
  const auto first = std::find(generated.begin(), generated.end(), stop);
  EXPECT_EQ(generate(decoder, prompt, 60, greedy, 256, {}, stop),
            std::vector<int32_t>(generated.begin(), first + 1));
  expect_error([&] { generate(decoder, {}, 5, greedy, 300); }, "at least one token");
  expect_error([&] { generate(decoder, short_prompt, 5, greedy, 301); }, "vocab_limit 301");
}

TEST(Generate, ASeedRepeatsItsTokensAndOtherSeedsDiffer) {
  TinyModel m;
  GPT2Decoder decoder(m.model, *m.be);
  const std::vector<int32_t> prompt = random_tokens(5, 300, 13);
  auto run = [&](uint64_t seed) {
    TokenSampler sampler(SamplingOptions{1.0, 0, seed});
    return generate(decoder, prompt, 40, sampler, 300);
  };
  EXPECT_EQ(run(4), run(4));
  EXPECT_NE(run(4), run(5));
}

// ---------------------------------------------------------------------------------------
// TokenSampler

TEST(TokenSampler, GreedyTakesTheMostLikelyAndTheLowestIdAmongEquals) {
  TokenSampler greedy(SamplingOptions{0.0, 0, 1});
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(greedy.next(logits), 1);
  EXPECT_EQ(greedy.next(std::vector<float>{-3.0f}), 0);
  TokenSampler top1(SamplingOptions{1.0, 1, 9});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(top1.next(logits), 1);
}

TEST(TokenSampler, DrawsFollowTheSoftmaxAtTheTemperature) {
  const std::vector<float> logits = {1.0f, 0.0f, 2.0f, -1.0f, 0.5f};
  for (const double temperature : {0.5, 1.0, 2.0}) {
    SCOPED_TRACE("temperature " + std::to_string(temperature));
    TokenSampler sampler(SamplingOptions{temperature, 0, 21});
    std::vector<double> expected(logits.size());
    double total = 0.0;
    for (size_t i = 0; i < logits.size(); ++i)
      total += expected[i] = std::exp(logits[i] / temperature);
    std::vector<int> counts(logits.size());
    const int draws = 40000;
    for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sampler.next(logits))];
    for (size_t i = 0; i < logits.size(); ++i) {
      const double p = expected[i] / total;
      // Five standard deviations of a binomial count.
      EXPECT_NEAR(counts[i], p * draws, 5.0 * std::sqrt(draws * p * (1 - p)) + 1) << "token " << i;
    }
  }
}

TEST(TokenSampler, TopKDrawsAmongTheKMostLikely) {
  const std::vector<float> logits = {0.1f, 3.0f, 0.2f, 2.9f, 0.0f, 2.8f, -5.0f};
  TokenSampler sampler(SamplingOptions{1.0, 3, 2});
  std::vector<int> counts(logits.size());
  for (int i = 0; i < 3000; ++i) ++counts[static_cast<size_t>(sampler.next(logits))];
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[3], 0);
  EXPECT_GT(counts[5], 0);
  EXPECT_EQ(counts[1] + counts[3] + counts[5], 3000);
  // The K tokens in proportion to their softmax at the temperature, which applies first:
  // at 0.5, exp(2 x) renormalised over tokens 1, 3 and 5.
  TokenSampler cold(SamplingOptions{0.5, 3, 4});
  std::vector<int> cold_counts(logits.size());
  const int draws = 40000;
  for (int i = 0; i < draws; ++i) ++cold_counts[static_cast<size_t>(cold.next(logits))];
  double total = 0.0;
  for (const size_t kept : {1, 3, 5}) total += std::exp(2.0 * logits[kept]);
  for (const size_t kept : {1, 3, 5}) {
    const double p = std::exp(2.0 * logits[kept]) / total;
    EXPECT_NEAR(cold_counts[kept], p * draws, 5.0 * std::sqrt(draws * p * (1 - p)))
        << "token " << kept;
  }
  // top_k at or above the vocabulary is all of it.
  TokenSampler all(SamplingOptions{1.0, 100, 2});
  TokenSampler none(SamplingOptions{1.0, 0, 2});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(all.next(logits), none.next(logits));
}

// Nucleus sampling: the fewest most likely tokens whose probabilities reach top_p, the one
// that reaches it included, drawn in proportion to their probabilities. Probabilities 0.4,
// 0.3, 0.2, 0.1 (tokens 2, 0, 3, 1): top_p 0.65 keeps tokens 2 and 0 (0.7 reaches it), 0.75
// keeps 2, 0 and 3, and top_k 2 first leaves 2 and 0 (renormalised 4/7 and 3/7), of which
// top_p 0.5 keeps token 2 alone.
TEST(TokenSampler, TopPDrawsAmongTheFewestMostLikelyThatReachIt) {
  const std::vector<float> logits = {std::log(0.3f), std::log(0.1f), std::log(0.4f),
                                     std::log(0.2f)};
  const auto frequencies = [&](const SamplingOptions& options) {
    TokenSampler sampler(options);
    std::vector<double> counts(logits.size());
    const int draws = 40000;
    for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(sampler.next(logits))];
    for (double& c : counts) c /= draws;
    return counts;
  };
  const auto expect_near = [](const std::vector<double>& got, const std::vector<double>& want) {
    for (size_t i = 0; i < want.size(); ++i) {
      // Five standard deviations of a frequency over 40000 draws; an excluded token never.
      const double tolerance = want[i] == 0.0 ? 0.0 : 5.0 * std::sqrt(0.25 / 40000);
      EXPECT_NEAR(got[i], want[i], tolerance) << "token " << i;
    }
  };
  {
    SCOPED_TRACE("top_p 0.65");
    expect_near(frequencies({1.0, 0, 5, 0.65}), {3.0 / 7, 0.0, 4.0 / 7, 0.0});
  }
  {
    SCOPED_TRACE("top_p 0.75");
    expect_near(frequencies({1.0, 0, 5, 0.75}), {3.0 / 9, 0.0, 4.0 / 9, 2.0 / 9});
  }
  {
    SCOPED_TRACE("top_k 2, then top_p 0.5");
    expect_near(frequencies({1.0, 2, 5, 0.5}), {0.0, 0.0, 1.0, 0.0});
  }
  {
    // The temperature applies first: at 2 the probabilities are proportional to sqrt(p),
    // 0.325, 0.282, 0.230, 0.163 (tokens 2, 0, 3, 1), and top_p 0.65 needs three of them
    // (at temperature 1 it kept two).
    SCOPED_TRACE("temperature 2, top_p 0.65");
    const double total = std::sqrt(0.3) + std::sqrt(0.4) + std::sqrt(0.2);
    expect_near(frequencies({2.0, 0, 5, 0.65}),
                {std::sqrt(0.3) / total, 0.0, std::sqrt(0.4) / total, std::sqrt(0.2) / total});
  }
  // Among 1000 equally likely tokens, top_p 0.5 keeps the 500 of the lowest ids, found a
  // prefix at a time (64, 128, 256, 512), and draws them all alike.
  {
    const std::vector<float> equal(1000, 0.25f);
    TokenSampler half(SamplingOptions{1.0, 0, 7, 0.5});
    std::vector<int> counts(2);
    for (int i = 0; i < 20000; ++i) ++counts[half.next(equal) < 250 ? 0 : 1];
    EXPECT_NEAR(counts[0], 10000, 5.0 * std::sqrt(5000.0)) << "ids below 250";
    TokenSampler again(SamplingOptions{1.0, 0, 8, 0.5});
    int highest = 0;
    for (int i = 0; i < 20000; ++i) highest = std::max(highest, again.next(equal));
    EXPECT_EQ(highest, 499);
  }
  // A tiny top_p keeps the most likely token alone: greedy.
  TokenSampler tiny(SamplingOptions{1.0, 0, 5, 1e-9});
  for (int i = 0; i < 20; ++i) EXPECT_EQ(tiny.next(logits), 2);
  // top_p 1 is every token, as without it: the same draws.
  TokenSampler one(SamplingOptions{1.0, 0, 5, 1.0});
  TokenSampler plain(SamplingOptions{1.0, 0, 5});
  for (int i = 0; i < 50; ++i) EXPECT_EQ(one.next(logits), plain.next(logits));
}

// Excluded ids are never drawn, greedy or not, however likely; the others keep their
// distribution (here: uniform over ids 1 and 3 at equal logits).
TEST(TokenSampler, ExcludedIdsAreNeverDrawn) {
  const std::vector<float> logits = {9.0f, 1.0f, 8.0f, 1.0f};
  TokenSampler greedy(SamplingOptions{0.0, 0, 1, 1.0, {0, 2}});
  EXPECT_EQ(greedy.next(logits), 1);
  for (int64_t top_k : {0, 1, 3}) {
    TokenSampler sampler(SamplingOptions{1.0, top_k, 3, 1.0, {0, 2}});
    int ones = 0;
    for (int i = 0; i < 2000; ++i) {
      const int32_t token = sampler.next(logits);
      ASSERT_TRUE(token == 1 || token == 3) << token;
      ones += token == 1;
    }
    if (top_k == 1) {
      EXPECT_EQ(ones, 2000) << "top-k 1 is the lower id among equals";
    } else {
      EXPECT_NEAR(ones, 1000, 150) << "top_k " << top_k;
    }
  }
  TokenSampler nothing_left(SamplingOptions{1.0, 0, 3, 1.0, {0, 1, 2, 3}});
  EXPECT_THROW(nothing_left.next(logits), core::Error);
}

TEST(TokenSampler, SeedsRepeatAndDiffer) {
  std::vector<float> logits(50);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = normal(3, static_cast<int64_t>(i), 1.0f);
  auto draws = [&](uint64_t seed) {
    TokenSampler sampler(SamplingOptions{1.0, 0, seed});
    std::vector<int32_t> out;
    for (int i = 0; i < 30; ++i) out.push_back(sampler.next(logits));
    return out;
  };
  EXPECT_EQ(draws(1), draws(1));
  EXPECT_NE(draws(1), draws(2));
}

TEST(TokenSampler, RefusesBadOptionsAndLogits) {
  expect_error(
      [] {
        TokenSampler(SamplingOptions{-0.1, 0, 1});
      },
      "temperature must be finite and >= 0");
  expect_error([] { TokenSampler(SamplingOptions{INFINITY, 0, 1}); }, "temperature");
  expect_error([] { TokenSampler(SamplingOptions{1.0, -1, 1}); }, "top_k must be >= 0, got -1");
  expect_error([] { TokenSampler(SamplingOptions{1.0, 0, 1, 0.0}); }, "top_p must lie in (0, 1]");
  expect_error([] { TokenSampler(SamplingOptions{1.0, 0, 1, 1.5}); }, "top_p must lie in (0, 1]");
  expect_error([] { TokenSampler(SamplingOptions{1.0, 0, 1, NAN}); }, "top_p must lie in (0, 1]");
  TokenSampler sampler(SamplingOptions{1.0, 0, 1});
  expect_error([&] { sampler.next(std::vector<float>{0.0f, NAN}); }, "logit 1 is ");
  expect_error([&] { sampler.next(std::vector<float>{}); }, "no logits");
}

}  // namespace
}  // namespace mantissa::models
