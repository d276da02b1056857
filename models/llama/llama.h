// The Llama family (Llama 2/3, Mistral, Qwen and torchtitan's default decoder): token
// embedding, n_layer pre-RMSNorm blocks (causal self-attention with rotary position
// embeddings and grouped-query attention, then a SwiGLU MLP, each in a residual branch), a
// final RMSNorm and an LM head, untied from the embedding unless tie_embeddings. No biases.
//
// Each block, for the residual stream x[N, C]:
//   qkv = rmsnorm(x) Wqkv^T          q, k and v side by side: n_head, n_kv_head, n_kv_head heads
//   q, k = rope(q), rope(k)          Hugging Face's rotate_half pairing, base rope_theta
//   x2  = x + attention(q, k, v) Wo^T   every group of n_head / n_kv_head query heads shares
//                                        one key/value head
//   out = x2 + down(silu(gate(h)) * up(h)),  h = rmsnorm(x2)
// The q|k|v and the gate|up projections are each one fused Linear (one GEMM, one FP8
// operand), which the Hugging Face export splits into q_proj, k_proj, v_proj and gate_proj,
// up_proj. Since RoPE pairs channels as rotate_half does, the rows of q and k are those of
// Hugging Face's q_proj and k_proj unpermuted.
//
// Parameter names (the ParameterStore's; importers and exporters rely on them), L layers,
// D = n_embd / n_head, I = ffn_hidden, Vp = padded_vocab_size():
//   embed_tokens.weight                          [Vp, C]
//   layers.<i>.input_layernorm.weight            [C]
//   layers.<i>.self_attn.qkv_proj.weight         [(n_head + 2 n_kv_head) D, C]  rows q | k | v
//   layers.<i>.self_attn.o_proj.weight           [C, n_head D]
//   layers.<i>.post_attention_layernorm.weight   [C]
//   layers.<i>.mlp.gate_up_proj.weight           [2I, C]  rows gate | up
//   layers.<i>.mlp.down_proj.weight              [C, I]
//   norm.weight                                  [C]
//   lm_head.weight                               [Vp, C]  (absent when tie_embeddings)
// The vocabulary is padded as GPT-2's is (models/gpt2/gpt2.h): the rows past vocab_size start
// at zero, get no gradient and are dropped by exports.
//
// Initialisation: weights N(0, 0.02), the residual projections o_proj and down_proj
// N(0, 0.02 / sqrt(2 n_layer)) (as GPT-2, so the residual stream's variance does not grow
// with depth), RMSNorm gains 1.
#pragma once

#include <memory>
#include <vector>

#include "core/int_math.h"
#include "core/tensor/tensor.h"
#include "models/nn/causal_self_attention.h"
#include "models/nn/linear.h"
#include "models/nn/lm_head.h"
#include "models/nn/rms_norm.h"
#include "train/fp8_operands.h"
#include "train/language_model.h"

namespace mantissa::models {

struct LlamaConfig {
  int64_t n_layer = 6;
  int64_t n_head = 6;
  int64_t n_kv_head = 6;  // key/value heads; divides n_head (n_head: plain multi-head)
  int64_t n_embd = 384;
  int64_t ffn_hidden = 1024;  // SwiGLU width I
  int64_t seq_len = 256;
  int64_t vocab_size = 256;
  double rope_theta = 10000.0;
  float norm_eps = 1e-5f;
  bool tie_embeddings = false;

  static constexpr int64_t kVocabPadding = 128;
  int64_t padded_vocab_size() const { return core::round_up(vocab_size, kVocabPadding); }
  int64_t head_dim() const { return n_embd / n_head; }
};

class LlamaBlock;

class Llama final : public train::LanguageModel {
 public:
  Llama(const LlamaConfig& config, core::Backend& backend, const core::PrecisionPolicy& policy,
        uint64_t seed, const core::Fp8ScalingConfig& fp8 = {}, train::MasterShard shard = {});
  ~Llama() override;

  train::ParameterStore& parameters() override { return params_; }
  train::Fp8Operands* fp8_operands() override { return fp8_ ? fp8_.get() : nullptr; }
  core::Tensor forward(train::StepContext& ctx, const train::BatchTensors& batch,
                       float dloss_per_token) override;
  void backward(train::StepContext& ctx) override;
  core::Tensor logits(train::StepContext& ctx, const core::Tensor& tokens) override;
  int64_t parameter_count() const override;
  double flops_per_token() const override;

  const LlamaConfig& config() const { return config_; }
  // RoPE's angles, [seq_len, head_dim] F32 on the model's device (core/ops/rope_table.h).
  const core::Tensor& rope_table() const { return rope_table_; }

 private:
  // The final RMSNorm's output [B*T, C] for tokens [B, T] (the blocks save their activations).
  core::Tensor hidden(train::StepContext& ctx, const core::Tensor& tokens);

  LlamaConfig config_;
  train::ParameterStore params_;
  std::unique_ptr<train::Fp8Operands> fp8_;
  core::Tensor rope_table_;  // [seq_len, D] F32 on the device
  int embed_, lm_head_;      // lm_head_ == embed_ when tied
  std::vector<std::unique_ptr<LlamaBlock>> blocks_;
  std::unique_ptr<RMSNorm> norm_;
  std::unique_ptr<LMHead> head_;
  train::BatchTensors batch_;  // saved by a training forward for backward
};

}  // namespace mantissa::models
