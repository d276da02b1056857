// Text generation with Llama: the forward pass of a growing sequence with a KV cache, as
// GPT2Decoder does it for GPT-2 (models/gpt2/gpt2_decoder.h), through the same ops as training's
// forward (RMSNorm, the block GEMMs, RoPE at the tokens' positions, SwiGLU, residual adds, the
// LM head) in the dtype of the model's compute copy; only the attention reads the cache.
//
// The cache holds, per layer, K and V [seq_len, n_head D] after the key/value heads are
// repeated to the multi-head layout that attention_decode reads (repeat_kv_heads): with
// grouped-query attention it is n_head / n_kv_head times larger than the heads it repeats.
// Keys are cached after RoPE, so a cached key never needs its position again.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/ops/backend.h"
#include "core/tensor/tensor.h"
#include "models/decoder.h"
#include "models/llama/llama.h"

namespace mantissa::models {

class LlamaDecoder final : public Decoder {
 public:
  // Reads the weights of `model` (its compute copy, as it is when each token runs) on
  // `backend`, the model's; both must outlive the decoder. Allocates the cache: 2 n_layer
  // seq_len n_embd values of the compute dtype.
  LlamaDecoder(Llama& model, core::Backend& backend);

 private:
  // A block's parameters (compute copies) and its cache.
  struct Layer {
    core::Tensor input_norm, qkv_proj, o_proj, post_attention_norm, gate_up_proj, down_proj;
    core::Tensor k_cache, v_cache;  // [seq_len, n_head D]
  };

  core::Tensor final_hidden(const core::Tensor& tokens, int64_t start, bool cached) override;
  const core::Tensor& head() const override { return lm_head_; }
  core::Tensor rmsnorm(const core::Tensor& x, const core::Tensor& weight);

  LlamaConfig config_;
  core::Tensor embed_;    // the first vocab_size rows of the token embedding
  core::Tensor lm_head_;  // the first vocab_size rows of the LM head (embed_ when tied)
  core::Tensor norm_;
  core::Tensor rope_table_;
  std::vector<Layer> layers_;
};

}  // namespace mantissa::models
