// The GPT-2 family: token + position embeddings, n_layer pre-LayerNorm transformer blocks
// (causal self-attention and a GELU MLP, each in a residual branch), a final LayerNorm and
// an LM head tied to the token embedding.
//
// Initialisation follows GPT-2: weights N(0, 0.02), the two residual projections of each
// block N(0, 0.02 / sqrt(2 n_layer)) so the residual stream's variance does not grow with
// depth, biases 0, LayerNorm gain 1. Parameter names follow the GPT-2 checkpoints
// (wte, wpe, h.<i>.ln_1, h.<i>.attn.c_attn, ...), which importers rely on.
#pragma once

#include <memory>
#include <vector>

#include "models/nn/layer_norm.h"
#include "models/nn/linear.h"
#include "train/fp8_operands.h"
#include "train/language_model.h"

namespace mantissa::models {

struct GPT2Config {
  int64_t n_layer = 6;
  int64_t n_head = 6;
  int64_t n_embd = 384;
  int64_t seq_len = 256;  // longest sequence (size of the position table)
  int64_t vocab_size = 256;
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
  double forward(train::StepContext& ctx, const train::BatchTensors& batch,
                 float dloss_per_token) override;
  void backward(train::StepContext& ctx) override;
  double flops_per_token() const override;

  const GPT2Config& config() const { return config_; }

 private:
  GPT2Config config_;
  train::ParameterStore params_;
  std::unique_ptr<train::Fp8Operands> fp8_;
  int wte_, wpe_;
  std::vector<std::unique_ptr<GPT2Block>> blocks_;
  std::unique_ptr<LayerNorm> ln_f_;
  // Saved by forward for backward.
  train::BatchTensors batch_;
  core::Tensor final_hidden_;  // ln_f output [N, C]
  core::Tensor logits_;        // [N, V] F32; holds dlogits after a training forward
};

}  // namespace mantissa::models
