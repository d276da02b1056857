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

 private:
  // A block's parameters (compute copies) and its cache.
  struct Layer {
    core::Tensor ln_1_weight, ln_1_bias, attn_weight, attn_bias, attn_proj_weight, attn_proj_bias,
        ln_2_weight, ln_2_bias, fc_weight, fc_bias, mlp_proj_weight, mlp_proj_bias;
    core::Tensor k_cache, v_cache;  // [seq_len, C]
  };

  core::Tensor final_hidden(const core::Tensor& tokens, int64_t start, bool cached) override;
  const core::Tensor& head() const override { return wte_; }
  core::Tensor layernorm(const core::Tensor& x, const core::Tensor& weight,
                         const core::Tensor& bias);
  // x W^T + b.
  core::Tensor linear_bias(const core::Tensor& x, const core::Tensor& weight,
                           const core::Tensor& bias);

  GPT2Config config_;
  core::Tensor wte_;  // the first vocab_size rows of the token embedding (and LM head)
  core::Tensor wpe_;
  core::Tensor ln_f_weight_, ln_f_bias_;
  std::vector<Layer> layers_;
};

}  // namespace mantissa::models
