// The per-element pieces of a softmax over a row and of the fused softmax cross-entropy, one
// definition for host and device: the CPU backend's loops and the CUDA kernels call these (the
// row maxima and sums around them are each backend's own). Used by causal attention (softmax
// of the scores, and its backward) and by softmax_cross_entropy.
//
// softmax(z)_i = exp(z_i - max) / sum_j exp(z_j - max): subtracting the row maximum keeps exp
// from overflowing and changes nothing mathematically.
#pragma once

#include <cmath>

#include "core/dtype/dtype.h"

namespace mantissa::core {

// One step of the scan for the row maximum. A NaN never wins the comparison, so it does not
// hide the maximum, but it still turns the row's sum (hence its softmax or loss) into NaN.
MANTISSA_HD float softmax_max(float running_max, float z) {
  return z > running_max ? z : running_max;
}

// exp(z - max), the unnormalised softmax term (in (0, 1] for a finite row).
MANTISSA_HD float softmax_exp(float z, float row_max) {
  return expf(z - row_max);
}

// The backward of a softmax row P given the upstream gradient dP: the Jacobian product
//   dz_i = P_i (dP_i - sum_j P_j dP_j),
// which is O(1) per element once the row's sum_j P_j dP_j is known.
MANTISSA_HD float softmax_backward(float p, float dp, float p_dot_dp) {
  return p * (dp - p_dot_dp);
}

// The cross-entropy loss of a row from its softmax sums:
//   loss = logsumexp(z) - z[target] = max + log(sum exp(z - max)) - z[target].
MANTISSA_HD float cross_entropy_loss(float row_max, float exp_sum, float z_target) {
  return row_max + logf(exp_sum) - z_target;
}

// d loss / d z_i scaled by grad_scale, from the softmax probability p_i:
//   dz_i = (p_i - [i == target]) grad_scale.
MANTISSA_HD float cross_entropy_grad(float p, bool is_target, float grad_scale) {
  return (is_target ? p - 1.0f : p) * grad_scale;
}

}  // namespace mantissa::core
