#include "models/nn/rms_norm.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

RMSNorm::RMSNorm(train::ParameterStore& store, const std::string& name, int64_t channels, float eps)
    : store_(store), eps_(eps) {
  gain_ = store.add({name + ".weight", Shape{channels}, train::Init::kOnes, 0.0f, false});
}

Tensor RMSNorm::forward(train::StepContext& ctx, const Tensor& x) {
  core::Backend& be = ctx.backend;
  Tensor out = Tensor::empty(x.shape(), ctx.policy.compute_dtype, be.device());
  rstd_ = Tensor::empty(Shape{x.dim(0)}, DType::kF32, be.device());
  be.rmsnorm_forward(x, store_[gain_].compute, eps_, out, rstd_);
  saved_x_ = x;
  return out;
}

Tensor RMSNorm::backward(train::StepContext& ctx, const Tensor& dout) {
  core::Backend& be = ctx.backend;
  Tensor dx = Tensor::empty(saved_x_.shape(), ctx.policy.compute_dtype, be.device());
  be.rmsnorm_backward(dout, saved_x_, store_[gain_].compute, rstd_, dx, store_[gain_].grad);
  ctx.mark_grad_ready(gain_);
  saved_x_ = rstd_ = Tensor();
  return dx;
}

}  // namespace mantissa::models
