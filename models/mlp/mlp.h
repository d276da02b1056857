// A small MLP language model for quick tests: each position predicts the next token from
// its own token and position only,
//   logits = W_out gelu(W_fc (wte[token] + wpe[t]) + b_fc) + b_out,
// trained with the same step, precision policies and data as GPT-2 but in a fraction of the
// time. Its Linear layers take part in FP8 when the policy asks for it.
#pragma once

#include <memory>

#include "models/nn/linear.h"
#include "train/fp8_operands.h"
#include "train/language_model.h"

namespace mantissa::models {

struct MLPConfig {
  int64_t n_embd = 64;
  int64_t hidden = 256;
  int64_t seq_len = 64;
  int64_t vocab_size = 256;
};

class MLP final : public train::LanguageModel {
 public:
  MLP(const MLPConfig& config, core::Backend& backend, const core::PrecisionPolicy& policy,
      uint64_t seed, const core::Fp8ScalingConfig& fp8 = {}, train::MasterShard shard = {});

  train::ParameterStore& parameters() override { return params_; }
  train::Fp8Operands* fp8_operands() override { return fp8_ ? fp8_.get() : nullptr; }
  core::Tensor forward(train::StepContext& ctx, const train::BatchTensors& batch,
                       float dloss_per_token) override;
  void backward(train::StepContext& ctx) override;
  core::Tensor logits(train::StepContext& ctx, const core::Tensor& tokens) override;
  int64_t parameter_count() const override { return params_.parameter_count(); }
  double flops_per_token() const override;

 private:
  // out(gelu(fc(embedding))) of tokens [B, T]: [B*T, V] in the compute dtype; keeps fc_out_.
  core::Tensor compute_logits(train::StepContext& ctx, const core::Tensor& tokens);

  MLPConfig config_;
  train::ParameterStore params_;
  std::unique_ptr<train::Fp8Operands> fp8_;
  int wte_, wpe_;
  std::unique_ptr<Linear> fc_, out_;
  train::BatchTensors batch_;
  core::Tensor fc_out_;  // pre-GELU activations
  core::Tensor logits_;  // [N, V], compute dtype; dlogits after a training forward
};

}  // namespace mantissa::models
