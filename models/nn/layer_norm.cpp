#include "models/nn/layer_norm.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

LayerNorm::LayerNorm(train::ParameterStore& store, const std::string& name, int64_t channels)
    : store_(store) {
  gamma_ = store.add({name + ".weight", Shape{channels}, train::Init::kOnes, 0.0f, false});
  beta_ = store.add({name + ".bias", Shape{channels}, train::Init::kZeros, 0.0f, false});
}

Tensor LayerNorm::forward(train::StepContext& ctx, const Tensor& x) {
  core::Backend& be = ctx.backend;
  Tensor out = Tensor::empty(x.shape(), ctx.policy.compute_dtype, be.device());
  mean_ = Tensor::empty(Shape{x.dim(0)}, DType::kF32, be.device());
  rstd_ = Tensor::empty(Shape{x.dim(0)}, DType::kF32, be.device());
  be.layernorm_forward(x, store_[gamma_].compute, store_[beta_].compute, out, mean_, rstd_);
  saved_x_ = x;
  return out;
}

Tensor LayerNorm::backward(train::StepContext& ctx, const Tensor& dout) {
  core::Backend& be = ctx.backend;
  Tensor dx = Tensor::empty(saved_x_.shape(), ctx.policy.compute_dtype, be.device());
  be.layernorm_backward(dout, saved_x_, store_[gamma_].compute, mean_, rstd_, dx,
                        store_[gamma_].grad, store_[beta_].grad);
  ctx.mark_grad_ready(gamma_);
  ctx.mark_grad_ready(beta_);
  saved_x_ = mean_ = rstd_ = Tensor();
  return dx;
}

}  // namespace mantissa::models
