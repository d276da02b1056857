#include "models/nn/lm_head.h"

#include "core/error.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

LMHead::LMHead(train::ParameterStore& store, int weight, int64_t vocab_size)
    : store_(store), weight_(weight), vocab_size_(vocab_size) {}

Tensor LMHead::logits(train::StepContext& ctx, const Tensor& hidden) const {
  const Tensor& w = store_[weight_].compute;
  Tensor out = Tensor::empty(Shape{hidden.dim(0), w.dim(0)}, DType::kF32, ctx.backend.device());
  core::GemmParams p;
  p.trans_b = true;
  ctx.backend.gemm(hidden, w, out, p);
  return out;
}

Tensor LMHead::forward(train::StepContext& ctx, const Tensor& hidden, const Tensor& targets,
                       float dloss_per_token) {
  core::Backend& be = ctx.backend;
  const DType dt = ctx.policy.compute_dtype;
  Tensor z = logits(ctx, hidden);
  Tensor losses = Tensor::empty(Shape{hidden.dim(0)}, DType::kF32, be.device());
  if (dloss_per_token <= 0.0f) {
    be.softmax_cross_entropy(z, vocab_size_, targets, losses, nullptr, dloss_per_token);
    drop();
    return losses;
  }
  Tensor dlogits = dt == DType::kF32 ? z : Tensor::empty(z.shape(), dt, be.device());
  be.softmax_cross_entropy(z, vocab_size_, targets, losses, &dlogits, dloss_per_token);
  hidden_ = hidden;
  dlogits_ = dlogits;
  return losses;
}

Tensor LMHead::backward(train::StepContext& ctx) {
  MANTISSA_CHECK(has_pass(), "LMHead.backward: no training forward pass to differentiate");
  core::Backend& be = ctx.backend;
  const DType dt = ctx.policy.compute_dtype;
  train::Parameter& w = store_[weight_];
  Tensor dhidden = Tensor::empty(hidden_.shape(), dt, be.device());
  be.gemm(dlogits_, w.compute, dhidden, core::GemmParams{});
  core::GemmParams weight_grad;
  weight_grad.trans_a = true;
  weight_grad.beta = 1.0f;
  be.gemm(dlogits_, hidden_, w.grad, weight_grad);
  drop();
  return dhidden;
}

}  // namespace mantissa::models
