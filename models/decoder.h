// Text generation: a model's forward pass over a growing sequence with a KV cache, behind one
// interface (GPT2Decoder, LlamaDecoder), and the loop that draws tokens from it.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "core/ops/backend.h"
#include "core/tensor/tensor.h"
#include "models/sampling.h"

namespace mantissa::models {

// What every family's decoder shares: the window, the cache length, the tokens' way to the
// device, the attention over the cache (or, without it, over the whole sequence) and the LM
// head. A family supplies the forward pass from token ids to the final hidden rows.
class Decoder {
 public:
  virtual ~Decoder() = default;

  int64_t capacity() const { return capacity_; }      // positions the cache holds (seq_len)
  int64_t length() const { return length_; }          // positions in it now
  int64_t vocab_size() const { return vocab_size_; }  // the model's (unpadded) vocabulary
  core::Backend& backend() const { return backend_; }
  void clear() { length_ = 0; }

  // Runs `tokens` at positions length(), length() + 1, ... (at least one, and length() +
  // tokens.size() <= capacity()), adding their keys and values to the cache. Returns the
  // logits of the token after the last one: [vocab_size] F32 on the backend's device (the
  // first vocab_size of a padded LM head's), valid until the next call.
  core::Tensor append(std::span<const int32_t> tokens);

  // The logits after every position of `tokens` (positions 0, 1, ...; at most capacity()) from
  // the full causal forward, attention_forward over the whole sequence (the materialised
  // attention, which a CPU trains with; a GPU's flash attention differs by rounding); the
  // cache is neither read nor changed. [tokens.size(), vocab_size] F32 on the device.
  core::Tensor full_logits(std::span<const int32_t> tokens);

 protected:
  // `name` ("GPT2Decoder") for messages; `dtype`: the compute copy's, in which tokens run.
  Decoder(const char* name, core::Backend& backend, core::DType dtype, int64_t capacity,
          int64_t vocab_size);

  // The family's forward pass of tokens [1, n] (I32, on the device) at positions start,
  // start + 1, ...: the final norm's output for the last position (cached) or for every
  // position, [rows, C] in dtype().
  virtual core::Tensor final_hidden(const core::Tensor& tokens, int64_t start, bool cached) = 0;
  // The LM head's first vocab_size rows, [vocab_size, C].
  virtual const core::Tensor& head() const = 0;

  core::DType dtype() const { return dtype_; }
  // x W^T, W stored [out, in] (models/nn/linear.h), in dtype().
  core::Tensor linear(const core::Tensor& x, const core::Tensor& weight);
  // Causal attention of the rows qkv [n, 3C] (q | k | v, n_head heads each) at positions
  // start...: over the cache, which takes their keys and values (cached), or over the n rows
  // alone with FP32 probabilities (the output uses them unrounded anyway, as training's
  // forward does). [n, C] in dtype().
  core::Tensor attend(const core::Tensor& qkv, core::Tensor& k_cache, core::Tensor& v_cache,
                      int64_t n_head, int64_t start, bool cached);

 private:
  core::Tensor forward(std::span<const int32_t> tokens, bool cached);

  const char* name_;
  core::Backend& backend_;
  core::DType dtype_;
  int64_t capacity_, vocab_size_;
  int64_t length_ = 0;
};

// Generates `max_new_tokens` tokens after `prompt` (at least one token), drawing each from the
// first `vocab_limit` logits (the ids the caller can decode) with `sampler`. The last
// capacity() tokens of the prompt fill the cache. When the cache is full, the window slides:
// it is cleared and refilled with the last capacity() / 2 tokens (the newest included, at
// positions from 0, so they stay within the model's positions), after which capacity() / 2
// more tokens run one at a time; every token thus sees at least the last capacity() / 2
// tokens, and the refill's cost is spread over the tokens that follow it. Starts from an
// empty cache. `on_token`, when given, is called with each token as soon as it is drawn (to
// show text as it is generated). Generation ends early after drawing `stop_token` (it is
// returned and passed to on_token), unless that is negative.
std::vector<int32_t> generate(Decoder& decoder, std::span<const int32_t> prompt,
                              int64_t max_new_tokens, TokenSampler& sampler, int64_t vocab_limit,
                              const std::function<void(int32_t)>& on_token = {},
                              int32_t stop_token = -1);

}  // namespace mantissa::models
