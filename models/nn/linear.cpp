#include "models/nn/linear.h"

#include "core/error.h"
#include "train/fp8_operands.h"

namespace mantissa::models {

using core::DType;
using core::GemmParams;
using core::Shape;
using core::Tensor;

Linear::Linear(train::ParameterStore& store, const std::string& name, int64_t in, int64_t out,
               float init_std, train::Fp8Operands* fp8)
    : store_(store), in_(in), out_(out) {
  weight_ = store.add({name + ".weight", Shape{out, in}, train::Init::kNormal, init_std, true});
  bias_ = store.add({name + ".bias", Shape{out}, train::Init::kZeros, 0.0f, false});
  if (fp8 != nullptr) {
    x_slot_ = fp8->add(name + ".input", DType::kE4M3);
    w_slot_ = fp8->add(name + ".weight", DType::kE4M3);
    dy_slot_ = fp8->add(name + ".grad_output", DType::kE5M2);
  }
}

Tensor Linear::forward(train::StepContext& ctx, const Tensor& x) {
  MANTISSA_CHECK(x.shape().rank() == 2 && x.dim(1) == in_,
                 "Linear(" << store_[weight_].spec.name << ").forward: input " << x.describe()
                           << " must be [N, " << in_ << "]");
  core::Backend& be = ctx.backend;
  const train::Parameter& w = store_[weight_];
  Tensor y = Tensor::empty(Shape{x.dim(0), out_}, ctx.policy.compute_dtype, be.device());
  used_fp8_ = ctx.policy.fp8_block_gemms && x_slot_ >= 0;
  GemmParams p;
  p.trans_b = true;
  if (used_fp8_) {
    saved_x_ = Tensor::empty(x.shape(), DType::kE4M3, be.device());
    saved_w_ = Tensor::empty(w.compute.shape(), DType::kE4M3, be.device());
    ctx.fp8->quantize(be, x_slot_, x, saved_x_);
    ctx.fp8->quantize(be, w_slot_, w.compute, saved_w_);
    p.a_scale = &ctx.fp8->scale_inv(x_slot_);
    p.b_scale = &ctx.fp8->scale_inv(w_slot_);
    p.fast_accumulate = true;  // forward GEMM: fast accumulation, as Transformer Engine does
    be.gemm(saved_x_, saved_w_, y, p);
  } else {
    saved_x_ = x;
    saved_w_ = Tensor();
    be.gemm(x, w.compute, y, p);
  }
  be.add_bias(y, store_[bias_].compute);
  return y;
}

Tensor Linear::backward(train::StepContext& ctx, const Tensor& dy) {
  core::Backend& be = ctx.backend;
  train::Parameter& w = store_[weight_];
  train::Parameter& b = store_[bias_];
  Tensor dx = Tensor::empty(Shape{dy.dim(0), in_}, ctx.policy.compute_dtype, be.device());

  GemmParams data_grad;    // dx = dy W
  GemmParams weight_grad;  // dW += dy^T x
  weight_grad.trans_a = true;
  weight_grad.beta = 1.0f;
  if (used_fp8_) {
    Tensor dy8 = Tensor::empty(dy.shape(), DType::kE5M2, be.device());
    ctx.fp8->quantize(be, dy_slot_, dy, dy8);
    data_grad.a_scale = &ctx.fp8->scale_inv(dy_slot_);
    data_grad.b_scale = &ctx.fp8->scale_inv(w_slot_);
    be.gemm(dy8, saved_w_, dx, data_grad);
    weight_grad.a_scale = &ctx.fp8->scale_inv(dy_slot_);
    weight_grad.b_scale = &ctx.fp8->scale_inv(x_slot_);
    be.gemm(dy8, saved_x_, w.grad, weight_grad);
  } else {
    be.gemm(dy, w.compute, dx, data_grad);
    be.gemm(dy, saved_x_, w.grad, weight_grad);
  }
  be.bias_backward(dy, b.grad);
  ctx.mark_grad_ready(weight_);
  ctx.mark_grad_ready(bias_);
  saved_x_ = Tensor();
  saved_w_ = Tensor();
  return dx;
}

}  // namespace mantissa::models
