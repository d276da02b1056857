// Text generation: a model's forward pass over a growing sequence with a KV cache, behind one
// interface (GPT2Decoder, LlamaDecoder), and the loop that draws tokens from it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/ops/backend.h"
#include "core/tensor/tensor.h"
#include "models/sampling.h"

namespace mantissa::models {

class Decoder {
 public:
  virtual ~Decoder() = default;

  virtual int64_t capacity() const = 0;    // positions the cache holds (the model's seq_len)
  virtual int64_t length() const = 0;      // positions in it now
  virtual int64_t vocab_size() const = 0;  // the model's (unpadded) vocabulary
  virtual core::Backend& backend() const = 0;
  virtual void clear() = 0;

  // Runs `tokens` at positions length(), length() + 1, ... (at least one, and length() +
  // tokens.size() <= capacity()), adding their keys and values to the cache. Returns the
  // logits of the token after the last one: [vocab_size] F32 on the backend's device (the
  // first vocab_size of a padded LM head's), valid until the next call.
  virtual core::Tensor append(std::span<const int32_t> tokens) = 0;

  // The logits after every position of `tokens` (positions 0, 1, ...; at most capacity()) from
  // the full causal forward, attention_forward over the whole sequence, as in training; the
  // cache is neither read nor changed. [tokens.size(), vocab_size] F32 on the device.
  virtual core::Tensor full_logits(std::span<const int32_t> tokens) = 0;
};

// Generates `max_new_tokens` tokens after `prompt` (at least one token), drawing each from the
// first `vocab_limit` logits (the ids the caller can decode) with `sampler`. The last
// capacity() tokens of the prompt fill the cache. When the cache is full, the window slides:
// it is cleared and refilled with the last capacity() / 2 tokens (the newest included, at
// positions from 0, so they stay within the model's positions), after which capacity() / 2
// more tokens run one at a time; every token thus sees at least the last capacity() / 2
// tokens, and the refill's cost is spread over the tokens that follow it. Starts from an
// empty cache.
std::vector<int32_t> generate(Decoder& decoder, std::span<const int32_t> prompt,
                              int64_t max_new_tokens, TokenSampler& sampler, int64_t vocab_limit);

}  // namespace mantissa::models
