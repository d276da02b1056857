// The LM head and the loss of a language model: logits = hidden W^T over a padded vocabulary,
// in FP32 so that the loss is exact, and the fused softmax cross-entropy over the first
// vocab_size columns (core::Backend::softmax_cross_entropy's valid_cols). W, stored [Vp, C],
// is a parameter of its own or the token embedding (a tied head).
//
// The loss writes dlogits in the compute dtype (GEMM operands share one dtype): in place of
// the logits in FP32, else into a tensor of their own, each value rounded once as a cast of
// FP32 dlogits would round it, so the FP32 logits are read once and dropped. Backward:
//   dhidden = dlogits W        W.grad += dlogits^T hidden
// The padding columns of dlogits are exactly 0, so W's padding rows add nothing to dhidden and
// receive nothing. The caller marks W's gradient ready: a tied W still receives the
// embedding's gradient after this.
#pragma once

#include "core/tensor/tensor.h"
#include "train/parameters.h"
#include "train/step_context.h"

namespace mantissa::models {

class LMHead {
 public:
  // `weight`: the store's index of W [Vp, C], Vp >= vocab_size.
  LMHead(train::ParameterStore& store, int weight, int64_t vocab_size);

  // F32 logits [N, Vp] of hidden [N, C]; keeps nothing.
  core::Tensor logits(train::StepContext& ctx, const core::Tensor& hidden) const;
  // Each row's loss against targets (I32, N elements), F32 [N] on the device. With
  // dloss_per_token > 0 the head keeps hidden and the dlogits for backward().
  core::Tensor forward(train::StepContext& ctx, const core::Tensor& hidden,
                       const core::Tensor& targets, float dloss_per_token);
  // dhidden [N, C] in the compute dtype; accumulates W's gradient.
  core::Tensor backward(train::StepContext& ctx);

  bool has_pass() const { return dlogits_.defined(); }  // a training forward to differentiate
  void drop() { hidden_ = dlogits_ = core::Tensor(); }  // forget a training forward

 private:
  train::ParameterStore& store_;
  int weight_;
  int64_t vocab_size_;
  core::Tensor hidden_;   // [N, C]
  core::Tensor dlogits_;  // [N, Vp] in the compute dtype
};

}  // namespace mantissa::models
