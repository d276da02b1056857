// Choosing the next token from a language model's logits: greedy, or a draw from the softmax
// at a temperature, optionally over the k most likely tokens only (nanoGPT's and llm.c's
// options) and over the most likely tokens that make up a share p of the probability only
// (nucleus sampling, Hugging Face's top_p), top-k first, as Hugging Face applies them.
//
// Draws come from core's counter-based random_u32(seed, draw number), so a seed gives the
// same tokens for the same logits on every machine and run, whatever else uses random numbers.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace mantissa::models {

struct SamplingOptions {
  // The logits are divided by it before the softmax: below 1 sharpens, above 1 flattens; 0
  // means greedy (the most likely token, the lowest id among equals), which draws nothing.
  double temperature = 1.0;
  // Draw among the k most likely tokens only (exactly k: the lower ids among equals); 0: all.
  int64_t top_k = 0;
  uint64_t seed = 0;
  // In (0, 1]: draw among the fewest most likely tokens (after top_k) whose probabilities sum
  // to at least top_p, the one that reaches it included; 1: all.
  double top_p = 1.0;
  // Ids never drawn, whatever their logits (a tokenizer's <unk> and control pieces, which
  // encoded text never holds); the rest are drawn from as if these were not there.
  std::vector<int32_t> excluded{};
};

class TokenSampler {
 public:
  // Throws core::Error for a temperature below 0 or not finite, a negative top_k, or a top_p
  // outside (0, 1].
  explicit TokenSampler(const SamplingOptions& options);

  // The next token, an index into `logits` (host memory, at least one id not excluded). A NaN
  // logit is an error (core::Error): the checkpoint's weights are not usable.
  int32_t next(std::span<const float> logits);

 private:
  SamplingOptions options_;
  uint64_t draws_ = 0;  // random numbers used so far
  // Scratch: the ids drawn from, in id order, or most likely first for top_k and top_p.
  std::vector<int32_t> candidates_;
  std::vector<double> weights_;  // scratch: their unnormalised probabilities
  std::vector<char> excluded_;   // per id, for the vocabulary size of the last call
};

}  // namespace mantissa::models
