// Text generation with GPT-2: the forward pass of a growing sequence with a KV cache.
//
// Each block's attention needs the keys and values of every earlier position. The cache keeps
// them, per layer K and V [seq_len, C], so a new token runs the weights once (a row through
// each GEMM) and attends over the cached rows (Backend::attention_decode): its cost is the
// weights' plus an attention term linear in the positions cached, instead of a forward pass
// over the whole window for every token. The tokens run through the same ops as training's
// forward (embedding, LayerNorm, the block GEMMs and their biases, GELU, residual adds, the
// tied LM head), in the dtype of the model's compute copy; only the attention reads the cache.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/tensor/tensor.h"
#include "models/decoder.h"
#include "models/gpt2/gpt2.h"

namespace mantissa::models {

class GPT2Decoder final : public Decoder {
 public:
  // Reads the weights of `model` (its compute copy, as it is when each token runs) on
  // `backend`, the model's; both must outlive the decoder. Allocates the cache: 2 n_layer
  // seq_len n_embd values of the compute dtype.
  GPT2Decoder(GPT2& model, core::Backend& backend);

  int64_t capacity() const override { return config_.seq_len; }
  int64_t length() const override { return length_; }
  int64_t vocab_size() const override { return config_.vocab_size; }
  core::Backend& backend() const override { return backend_; }
  void clear() override { length_ = 0; }
  core::Tensor append(std::span<const int32_t> tokens) override;
  core::Tensor full_logits(std::span<const int32_t> tokens) override;

 private:
  // A block's parameters (compute copies) and its cache.
  struct Layer {
    core::Tensor ln_1_weight, ln_1_bias, attn_weight, attn_bias, attn_proj_weight, attn_proj_bias,
        ln_2_weight, ln_2_bias, fc_weight, fc_bias, mlp_proj_weight, mlp_proj_bias;
    core::Tensor k_cache, v_cache;  // [seq_len, C]
  };

  // The forward pass of `tokens` at positions start, start + 1, ...: with the cache (start =
  // length()) or without it (start = 0). Returns the logits after the last position (cached)
  // or after every position.
  core::Tensor forward(std::span<const int32_t> tokens, bool cached);
  core::Tensor layernorm(const core::Tensor& x, const core::Tensor& weight,
                         const core::Tensor& bias);
  // x W^T + b, W stored [out, in] (models/nn/linear.h).
  core::Tensor linear(const core::Tensor& x, const core::Tensor& weight, const core::Tensor& bias);

  GPT2Config config_;
  core::Backend& backend_;
  core::DType dtype_;
  core::Tensor wte_;  // the first vocab_size rows of the token embedding (and LM head)
  core::Tensor wpe_;
  core::Tensor ln_f_weight_, ln_f_bias_;
  std::vector<Layer> layers_;
  int64_t length_ = 0;
};

}  // namespace mantissa::models
