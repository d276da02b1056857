#include "core/ops/attention.h"

#include <cmath>

#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

// The dtype two GEMM operands share: their own when they agree, else F32, which holds every
// BF16 and F16 value exactly.
DType common_dtype(DType a, DType b) {
  return a == b ? a : DType::kF32;
}

// Non-FP8 operands of one dtype produce F32 or their own dtype (core/ops/gemm_checks.h).
DType gemm_output_dtype(DType operands, DType wanted) {
  return wanted == operands ? wanted : DType::kF32;
}

// `t` itself when it already has `dtype`, else an exact widening copy.
Tensor as_dtype(Backend& be, const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor wide = Tensor::empty(t.shape(), dtype, be.device());
  be.cast(t, wide, {});
  return wide;
}

// The [B*H, T, D] operand p of heads[P, B, H, T, D].
Tensor part(const Tensor& heads, int64_t p) {
  const int64_t n = heads.dim(1) * heads.dim(2), T = heads.dim(3), D = heads.dim(4);
  return heads.view(p * n * T * D, Shape{n, T, D});
}

GemmParams transposed(bool a, bool b) {
  GemmParams p;
  p.trans_a = a;
  p.trans_b = b;
  return p;
}

// heads[P, B, H, T, D] for rows x[B, T, P*C] of H heads per part.
Tensor split(Backend& be, const Tensor& x, int64_t parts, int64_t H, DType dtype) {
  const int64_t B = x.dim(0), T = x.dim(1), D = x.dim(2) / (parts * H);
  Tensor heads = Tensor::empty(Shape{parts, B, H, T, D}, dtype, be.device());
  be.split_heads(x, heads);
  return heads;
}

}  // namespace

// S = q k^T is written straight into att when the GEMM can produce att's dtype from qkv's.
DType attention_score_dtype(DType qkv, DType att) {
  return gemm_output_dtype(qkv, att);
}

// dP = dy v^T, and dS after it, in the dtype the product's operands share.
DType attention_score_grad_dtype(DType qkv, DType dout) {
  return common_dtype(dout, qkv);
}

void composed_attention_forward(Backend& be, const Tensor& qkv, Tensor& out, Tensor& att,
                                int n_head) {
  const auto [B, T, C, H, D] = check_attention_forward(qkv, out, att, n_head, be.device());
  if (B * T == 0) return;
  const int64_t N = B * H;
  const float scale = attention_scale(D);

  const Tensor heads = split(be, qkv, 3, H, qkv.dtype());
  const Tensor q = part(heads, 0), k = part(heads, 1), v = part(heads, 2);

  // Scores straight into att when the GEMM can write its dtype, then the softmax in place.
  Tensor probs = att.reshape(Shape{N, T, T});
  const DType score_dtype = attention_score_dtype(qkv.dtype(), att.dtype());
  Tensor scores =
      score_dtype == att.dtype() ? probs : Tensor::empty(probs.shape(), score_dtype, be.device());
  be.gemm(q, k, scores, transposed(false, true));
  be.causal_softmax_forward(scores, scale, probs);

  const DType pv_dtype = common_dtype(att.dtype(), qkv.dtype());
  Tensor y =
      Tensor::empty(Shape{1, B, H, T, D}, gemm_output_dtype(pv_dtype, out.dtype()), be.device());
  Tensor y_rows = part(y, 0);
  be.gemm(as_dtype(be, probs, pv_dtype), as_dtype(be, v, pv_dtype), y_rows, {});
  be.merge_heads(y, out);
}

void composed_attention_backward(Backend& be, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& att, Tensor& dqkv, int n_head) {
  const auto [B, T, C, H, D] = check_attention_backward(dout, qkv, att, dqkv, n_head, be.device());
  if (B * T == 0) return;
  const int64_t N = B * H;
  const float scale = attention_scale(D);

  const Tensor heads = split(be, qkv, 3, H, qkv.dtype());
  const Tensor q = part(heads, 0), k = part(heads, 1), v = part(heads, 2);
  const Tensor dy = part(split(be, dout, 1, H, dout.dtype()), 0);
  const Tensor probs = att.reshape(Shape{N, T, T});

  // dP = dy v^T, then dS = softmax backward in place; both in the products' operand dtype.
  const DType dp_dtype = attention_score_grad_dtype(qkv.dtype(), dout.dtype());
  Tensor ds = Tensor::empty(probs.shape(), dp_dtype, be.device());
  be.gemm(as_dtype(be, dy, dp_dtype), as_dtype(be, v, dp_dtype), ds, transposed(false, true));
  be.causal_softmax_backward(probs, ds, scale, ds);

  // dQ, dK, dV land in heads of dqkv's dtype when every product can write it, else F32.
  const DType pdy_dtype = common_dtype(att.dtype(), dout.dtype());
  const DType sqk_dtype = common_dtype(dp_dtype, qkv.dtype());
  const bool direct = gemm_output_dtype(pdy_dtype, dqkv.dtype()) == dqkv.dtype() &&
                      gemm_output_dtype(sqk_dtype, dqkv.dtype()) == dqkv.dtype();
  Tensor dheads = Tensor::empty(heads.shape(), direct ? dqkv.dtype() : DType::kF32, be.device());
  Tensor dq = part(dheads, 0), dk = part(dheads, 1), dv = part(dheads, 2);
  be.gemm(as_dtype(be, probs, pdy_dtype), as_dtype(be, dy, pdy_dtype), dv, transposed(true, false));
  const Tensor ds_op = as_dtype(be, ds, sqk_dtype);
  be.gemm(ds_op, as_dtype(be, k, sqk_dtype), dq, {});
  be.gemm(ds_op, as_dtype(be, q, sqk_dtype), dk, transposed(true, false));
  be.merge_heads(dheads, dqkv);
}

}  // namespace mantissa::core
