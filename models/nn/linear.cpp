#include "models/nn/linear.h"

#include "core/error.h"
#include "train/fp8_operands.h"

namespace mantissa::models {

using core::DType;
using core::GemmParams;
using core::Shape;
using core::Tensor;

Linear::Linear(train::ParameterStore& store, const std::string& name, int64_t in, int64_t out,
               float init_std, train::Fp8Operands* fp8, bool with_bias)
    : store_(store), in_(in), out_(out) {
  weight_ = store.add({name + ".weight", Shape{out, in}, train::Init::kNormal, init_std, true});
  bias_ =
      with_bias ? store.add({name + ".bias", Shape{out}, train::Init::kZeros, 0.0f, false}) : -1;
  if (fp8 != nullptr) {
    x_slot_ = fp8->add(name + ".input", core::Fp8Role::kInput);
    w_slot_ = fp8->add(name + ".weight", core::Fp8Role::kWeight);
    dy_slot_ = fp8->add(name + ".grad_output", core::Fp8Role::kGradient);
  }
}

Tensor Linear::forward(train::StepContext& ctx, const Tensor& x) {
  MANTISSA_CHECK(x.shape().rank() == 2 && x.dim(1) == in_,
                 "Linear(" << store_[weight_].spec.name << ").forward: input " << x.describe()
                           << " must be [N, " << in_ << "]");
  used_fp8_ = ctx.policy.fp8_block_gemms && x_slot_ >= 0;
  if (used_fp8_ && ctx.fp8->block_scaled()) return forward_blocks(ctx, x);
  core::Backend& be = ctx.backend;
  const train::Parameter& w = store_[weight_];
  Tensor y = Tensor::empty(Shape{x.dim(0), out_}, ctx.policy.compute_dtype, be.device());
  GemmParams p;
  p.trans_b = true;
  if (used_fp8_) {
    saved_x_ = Tensor::empty(x.shape(), ctx.fp8->format(x_slot_), be.device());
    saved_w_ = Tensor::empty(w.compute.shape(), ctx.fp8->format(w_slot_), be.device());
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
  if (bias_ >= 0) be.add_bias(y, store_[bias_].compute);
  return y;
}

Tensor Linear::backward(train::StepContext& ctx, const Tensor& dy) {
  core::Backend& be = ctx.backend;
  train::Parameter& w = store_[weight_];
  Tensor dx;
  if (used_fp8_ && ctx.fp8->block_scaled()) {
    dx = backward_blocks(ctx, dy);
  } else {
    dx = Tensor::empty(Shape{dy.dim(0), in_}, ctx.policy.compute_dtype, be.device());
    GemmParams data_grad;    // dx = dy W
    GemmParams weight_grad;  // dW += dy^T x
    weight_grad.trans_a = true;
    weight_grad.beta = 1.0f;
    if (used_fp8_) {
      Tensor dy8 = Tensor::empty(dy.shape(), ctx.fp8->format(dy_slot_), be.device());
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
  }
  ctx.mark_grad_ready(weight_);
  if (bias_ >= 0) {
    be.bias_backward(dy, store_[bias_].grad);
    ctx.mark_grad_ready(bias_);
  }
  saved_x_ = Tensor();
  saved_w_ = Tensor();
  saved_xt_ = core::Fp8Operand();
  return dx;
}

// ---------------------------------------------------------------------------------------
// Block recipes: every GEMM in the TN layout, both operands scaled along K.

const core::Fp8Operand& Linear::weight_operand(train::StepContext& ctx, bool transposed) {
  const int which = transposed ? 1 : 0;
  // Outside a training step (ctx.step < 0) nothing says the weights are those of the kept
  // copy, so it is made again (and not kept).
  if (ctx.step < 0 || weight8_step_[which] != ctx.step) {
    weight8_[which] =
        ctx.fp8->quantize_operand(ctx.backend, w_slot_, store_[weight_].compute, transposed);
    weight8_step_[which] = ctx.step;
  }
  return weight8_[which];
}

Tensor Linear::forward_blocks(train::StepContext& ctx, const Tensor& x) {
  core::Backend& be = ctx.backend;
  train::Fp8Operands& fp8 = *ctx.fp8;
  Tensor y = Tensor::empty(Shape{x.dim(0), out_}, ctx.policy.compute_dtype, be.device());
  const core::Fp8Operand x8 = fp8.quantize_operand(be, x_slot_, x);
  core::gemm_k_major(be, x8, weight_operand(ctx, false), y, 0.0f);
  // The weight gradient's operand, regrouped along the tokens now, while x is at hand in
  // high precision: the layer keeps this FP8 copy instead of x.
  saved_xt_ = fp8.quantize_operand(be, x_slot_, x, true);
  saved_x_ = Tensor();
  saved_w_ = Tensor();
  if (bias_ >= 0) be.add_bias(y, store_[bias_].compute);
  return y;
}

Tensor Linear::backward_blocks(train::StepContext& ctx, const Tensor& dy) {
  core::Backend& be = ctx.backend;
  train::Fp8Operands& fp8 = *ctx.fp8;
  Tensor dx = Tensor::empty(Shape{dy.dim(0), in_}, ctx.policy.compute_dtype, be.device());
  const core::Fp8Operand dy8 = fp8.quantize_operand(be, dy_slot_, dy);
  core::gemm_k_major(be, dy8, weight_operand(ctx, true), dx, 0.0f);
  const core::Fp8Operand dyt8 = fp8.quantize_operand(be, dy_slot_, dy, true);
  core::gemm_k_major(be, dyt8, saved_xt_, store_[weight_].grad, 1.0f);
  return dx;
}

}  // namespace mantissa::models
