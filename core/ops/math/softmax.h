// The per-element pieces of a softmax over a row and of the fused softmax cross-entropy, one
// definition for host and device: the CPU backend's loops and the CUDA kernels call these (the
// row maxima and sums around them are each backend's own). Used by causal attention (softmax
// of the scores, and its backward) and by softmax_cross_entropy.
//
// softmax(z)_i = exp(z_i - max) / sum_j exp(z_j - max): subtracting the row maximum keeps exp
// from overflowing and changes nothing mathematically.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype/dtype.h"
#include "core/ops/math/exp_f32.h"

namespace mantissa::core {

// One step of the scan for the row maximum. A NaN never wins the comparison, so it does not
// hide the maximum, but it still turns the row's sum (hence its softmax or loss) into NaN.
MANTISSA_HD float softmax_max(float running_max, float z) {
  return z > running_max ? z : running_max;
}

// exp(z - max), the unnormalised softmax term (in (0, 1] for a finite row).
MANTISSA_HD float softmax_exp(float z, float row_max) {
  return exp_f32(z - row_max);
}

// The online form (Milakov and Gimelshein, 2018), which finds the maximum and the sum in one
// pass: a running maximum m and the running sum s of exp(z - m), rescaled by exp(m - m') when
// the maximum grows to m'. Partial states (a GPU lane's share of a row) merge the same way, so
// a row's terms can be split in any way; the result is the two-pass max and sum up to
// rounding. A state that has seen nothing is {-inf, 0}; one term z is {z, 1}. The special
// values come out as in the two-pass form: a NaN z leaves m alone and makes s NaN; a +inf z
// makes s NaN (inf - inf); -inf terms add 0 beside any finite maximum, and a row of nothing
// but -inf keeps m = -inf (the caller's exp(z - m) is then NaN, as two passes give).
struct SoftmaxState {
  float max;
  float sum;
};

// exp(old_max - new_max), the factor a sum relative to old_max takes on to new_max; 1 between
// two -inf maxima (terms that are all -inf stay counted until a finite maximum zeroes them).
MANTISSA_HD float softmax_rescale(float old_max, float new_max) {
  return old_max == -INFINITY && new_max == -INFINITY ? 1.0f : softmax_exp(old_max, new_max);
}

MANTISSA_HD SoftmaxState softmax_merge(SoftmaxState a, SoftmaxState b) {
  const float m = softmax_max(a.max, b.max);
  return {m, a.sum * softmax_rescale(a.max, m) + b.sum * softmax_rescale(b.max, m)};
}

// The backward of a softmax row P given the upstream gradient dP: the Jacobian product
//   dz_i = P_i (dP_i - sum_j P_j dP_j),
// which is O(1) per element once the row's sum_j P_j dP_j is known.
MANTISSA_HD float softmax_backward(float p, float dp, float p_dot_dp) {
  return p * (dp - p_dot_dp);
}

// The cross-entropy loss of a row from its softmax sums:
//   loss = logsumexp(z) - z[target] = (max - z[target]) + log(sum exp(z - max)).
// max - z[target] first: two logits far from zero (1e6, whose FP32 ulp is 0.0625) differ
// exactly, where max + log(sum) would round the loss to that ulp.
MANTISSA_HD float cross_entropy_loss(float row_max, float exp_sum, float z_target) {
  return (row_max - z_target) + logf(exp_sum);
}

// d loss / d z_i scaled by grad_scale, from the softmax probability p_i:
//   dz_i = (p_i - [i == target]) grad_scale.
MANTISSA_HD float cross_entropy_grad(float p, bool is_target, float grad_scale) {
  return (is_target ? p - 1.0f : p) * grad_scale;
}

// Attention's softmax is of the scores q.k / sqrt(D), D the head size: the scale keeps the
// scores' spread independent of D (Vaswani et al.). Every attention path scales by this float.
inline float attention_scale(int64_t head_dim) {
  return 1.0f / std::sqrt(static_cast<float>(head_dim));
}

// log(sum_j exp(z_j)) of a row from its maximum and its sum of exp(z_j - max): what flash
// attention keeps per row for its backward.
MANTISSA_HD float softmax_log_sum_exp(float row_max, float exp_sum) {
  return row_max + logf(exp_sum);
}

}  // namespace mantissa::core
