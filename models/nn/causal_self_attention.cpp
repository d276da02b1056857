#include "models/nn/causal_self_attention.h"

#include "core/error.h"
#include "core/ops/flash_attention_switch.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

Tensor CausalSelfAttention::forward(train::StepContext& ctx, const Tensor& qkv, int64_t n_head) {
  core::Backend& be = ctx.backend;
  MANTISSA_CHECK(qkv.shape().rank() == 3 && n_head > 0 && qkv.dim(2) % (3 * n_head) == 0,
                 "CausalSelfAttention: qkv " << qkv.describe() << " must be [B, T, 3C] with C a "
                                             << "multiple of n_head = " << n_head);
  const int64_t B = qkv.dim(0), T = qkv.dim(1), C = qkv.dim(2) / 3;
  n_head_ = static_cast<int>(n_head);
  qkv_ = qkv;
  Tensor out = Tensor::empty(Shape{B, T, C}, qkv.dtype(), be.device());
  flash_ = core::use_flash_attention(be, qkv.dtype(), C / n_head);
  if (flash_) {
    lse_ = Tensor::empty(Shape{B, n_head, T}, DType::kF32, be.device());
    be.flash_attention_forward(qkv, out, lse_, n_head_);
    out_ = out;
  } else {
    att_ = Tensor::empty(Shape{B, n_head, T, T}, qkv.dtype(), be.device());
    be.attention_forward(qkv, out, att_, n_head_);
  }
  return out;
}

Tensor CausalSelfAttention::backward(train::StepContext& ctx, const Tensor& dout) {
  core::Backend& be = ctx.backend;
  Tensor dqkv = Tensor::empty(qkv_.shape(), qkv_.dtype(), be.device());
  if (flash_) {
    be.flash_attention_backward(dout, qkv_, out_, lse_, dqkv, n_head_);
  } else {
    be.attention_backward(dout, qkv_, att_, dqkv, n_head_);
  }
  qkv_ = att_ = out_ = lse_ = Tensor();
  return dqkv;
}

}  // namespace mantissa::models
