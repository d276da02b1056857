// The GPT-2 family: token + position embeddings, n_layer pre-LayerNorm transformer blocks
// (causal self-attention and a GELU MLP, each in a residual branch), a final LayerNorm and
// an LM head tied to the token embedding.
//
// Initialisation follows GPT-2: weights N(0, 0.02), the two residual projections of each
// block N(0, 0.02 / sqrt(2 n_layer)) so the residual stream's variance does not grow with
// depth, biases 0, LayerNorm gain 1. Parameter names follow the GPT-2 checkpoints
// (wte, wpe, h.<i>.ln_1, h.<i>.attn.c_attn, ...), which importers rely on.
//
// The vocabulary is padded as llm.c pads it: wte, hence the tied LM head, has
// padded_vocab_size() rows, vocab_size rounded up to a multiple of 128 (GPT-2's 50257 becomes
// 50304), so that the LM-head GEMM, the largest of a step, has a dimension tensor cores tile
// evenly. The padding rows start at zero and stay there: no token or target reaches them, and
// the loss takes the softmax over the first vocab_size logits only (softmax_cross_entropy's
// valid_cols), so their logits get no probability and no gradient. Loss and gradients are
// those of the unpadded model. Exports drop the padding (files keep vocab_size rows);
// checkpoints keep the model's own buffers.
#pragma once

#include <memory>
#include <vector>

#include "core/int_math.h"
#include "models/nn/causal_self_attention.h"
#include "models/nn/layer_norm.h"
#include "models/nn/linear.h"
#include "models/nn/lm_head.h"
#include "train/fp8_operands.h"
#include "train/language_model.h"

namespace mantissa::models {

struct GPT2Config {
  int64_t n_layer = 6;
  int64_t n_head = 6;
  int64_t n_embd = 384;
  int64_t seq_len = 256;  // longest sequence (size of the position table)
  int64_t vocab_size = 256;

  // The rows of wte and the columns of the logits: vocab_size rounded up to a multiple of
  // kVocabPadding.
  static constexpr int64_t kVocabPadding = 128;
  int64_t padded_vocab_size() const { return core::round_up(vocab_size, kVocabPadding); }
};

class GPT2Block;

class GPT2 final : public train::LanguageModel {
 public:
  // Registers and allocates every parameter on the backend's device, keeping the masters of
  // `shard` only (ParameterStore::allocate); FP8 operand scaling (with `fp8` as its recipe)
  // is set up when the policy asks for FP8 block GEMMs.
  GPT2(const GPT2Config& config, core::Backend& backend, const core::PrecisionPolicy& policy,
       uint64_t seed, const core::Fp8ScalingConfig& fp8 = {}, train::MasterShard shard = {});
  ~GPT2() override;

  train::ParameterStore& parameters() override { return params_; }
  train::Fp8Operands* fp8_operands() override { return fp8_ ? fp8_.get() : nullptr; }
  core::Tensor forward(train::StepContext& ctx, const train::BatchTensors& batch,
                       float dloss_per_token) override;
  void backward(train::StepContext& ctx) override;
  core::Tensor logits(train::StepContext& ctx, const core::Tensor& tokens) override;
  int64_t parameter_count() const override;
  double flops_per_token() const override;

  const GPT2Config& config() const { return config_; }

 private:
  // ln_f(blocks(embedding)) of tokens [B, T]: [B*T, C] in the compute dtype.
  core::Tensor final_hidden(train::StepContext& ctx, const core::Tensor& tokens);

  GPT2Config config_;
  train::ParameterStore params_;
  std::unique_ptr<train::Fp8Operands> fp8_;
  int wte_, wpe_;
  std::vector<std::unique_ptr<GPT2Block>> blocks_;
  std::unique_ptr<LayerNorm> ln_f_;
  std::unique_ptr<LMHead> head_;
  // Saved by forward for backward.
  train::BatchTensors batch_;
};

}  // namespace mantissa::models
