// Causal multi-head self-attention composed from Backend ops, as llm.c computes it: every
// product is one strided-batched GEMM over the B*H heads (tensor cores on a GPU), and the
// only attention-specific kernels are the permutations and the causal softmax. The routine is
// written once, for every backend, so the CPU tests check the whole algorithm and only the
// primitive kernels differ between backends.
//
// Forward, with the heads of qkv[B, T, 3C] as [B*H, T, D] operands (D = C / H):
//   q | k | v   = split_heads(qkv)                              [3, B, H, T, D]
//   S           = q k^T                                          batched gemm, [B*H, T, T]
//   P           = causal_softmax_forward(S, 1/sqrt(D))          into att (in place over S)
//   y           = P v                                            batched gemm, [B*H, T, D]
//   out         = merge_heads(y)                                 [B, T, C]
// Backward, from dout and the saved P (q, k, v are split from qkv again: a permutation costs
// a few percent of the products' time, and the attention op's interface stays qkv and att):
//   dy          = split_heads(dout)
//   dP          = dy v^T,  dV = P^T dy                           batched gemms
//   dS          = causal_softmax_backward(P, dP, 1/sqrt(D))      in place over dP
//   dQ          = dS k,    dK = dS^T q                           batched gemms
//   dqkv        = merge_heads(dQ | dK | dV)
//
// Precision. Every GEMM accumulates in FP32 and writes its operands' dtype, so in BF16 (and
// FP8_HYBRID, whose attention is BF16) the scores S and their gradients dP and dS are BF16
// [B, H, T, T] matrices, like llm.c's preatt and PyTorch's unfused attention, and no FP32
// [B, H, T, T] buffer exists. Rounding S costs at most what rounding q and k to BF16 already
// costs (|error of q.k| <= 2^-9 sum |q_i k_i|, and rounding the sum adds 2^-9 |q.k|); the
// softmax itself runs in FP32. The scores are written straight into att and the softmax runs
// in place; dP and dS share one [B*H, T, T] buffer. With operands of mixed dtypes (qkv,
// att, dout, out of different activation dtypes, which the op allows), each product runs on
// the wider dtype (an exact widening copy of the narrower operand) and writes F32 when its
// destination's dtype is not one the GEMM can produce.
//
// One difference from a fused kernel: the GEMMs multiply the zeros above att's diagonal by
// the values and keys of later positions, so an inf or NaN in v (forward) or in k or v
// (backward) at position t2 can reach rows before t2 through 0 * inf = NaN. A training step
// with such a value has a non-finite loss either way.
#pragma once

#include "core/ops/backend.h"

namespace mantissa::core {

// Where the routine rounds its [B*H, T, T] intermediates (F32: not at all): the scores S in
// attention_score_dtype, the probabilities P in att's dtype, dP and dS in
// attention_score_grad_dtype. A fused implementation that rounds at the same points computes
// the same function up to the order of its FP32 sums (the CPU backend's does).
DType attention_score_dtype(DType qkv, DType att);
DType attention_score_grad_dtype(DType qkv, DType dout);

// The semantics of Backend::attention_forward and attention_backward (argument checks
// included), computed through `be`'s primitives.
void composed_attention_forward(Backend& be, const Tensor& qkv, Tensor& out, Tensor& att,
                                int n_head);
void composed_attention_backward(Backend& be, const Tensor& dout, const Tensor& qkv,
                                 const Tensor& att, Tensor& dqkv, int n_head);

}  // namespace mantissa::core
