// Causal multi-head self-attention over a fused q|k|v projection: the layer GPT-2 and Llama
// blocks share, holding what its backward needs. One function (core/ops/backend.h), two ways
// to compute it:
//   - materialised: attention_forward keeps the probabilities P [B, H, T, T];
//   - flash: flash_attention_forward keeps only its output and lse [B, H, T], and the backward
//     recomputes P tile by tile. No T x T matrix ever reaches memory, which is what makes
//     attention cheap on a GPU at T = 1024 and beyond.
// core/ops/flash_attention_switch.h says which runs (MANTISSA_FLASH_ATTENTION).
#pragma once

#include "core/tensor/tensor.h"
#include "train/step_context.h"

namespace mantissa::models {

class CausalSelfAttention {
 public:
  // out[B, T, C] from qkv[B, T, 3C] (n_head heads of D = C / n_head channels), in qkv's dtype.
  core::Tensor forward(train::StepContext& ctx, const core::Tensor& qkv, int64_t n_head);
  // dqkv[B, T, 3C] from dout[B, T, C]; frees what forward kept.
  core::Tensor backward(train::StepContext& ctx, const core::Tensor& dout);

 private:
  int n_head_ = 0;
  bool flash_ = false;
  core::Tensor qkv_, att_;  // materialised
  core::Tensor out_, lse_;  // flash
};

}  // namespace mantissa::models
