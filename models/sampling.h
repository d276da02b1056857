// Choosing the next token from a language model's logits: greedy, or a draw from the softmax
// at a temperature, optionally over the k most likely tokens only (nanoGPT's and llm.c's
// options).
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
  int64_t top_k = 0;  // draw among the k most likely tokens only; 0: among all
  uint64_t seed = 0;
};

class TokenSampler {
 public:
  // Throws core::Error for a temperature below 0 or not finite, or a negative top_k.
  explicit TokenSampler(const SamplingOptions& options);

  // The next token, an index into `logits` (host memory, at least one). A NaN logit is an
  // error (core::Error): the checkpoint's weights are not usable.
  int32_t next(std::span<const float> logits);

 private:
  SamplingOptions options_;
  uint64_t draws_ = 0;               // random numbers used so far
  std::vector<int32_t> candidates_;  // scratch: the ids drawn from, most likely first for top-k
  std::vector<double> weights_;      // scratch: their unnormalised probabilities
};

}  // namespace mantissa::models
