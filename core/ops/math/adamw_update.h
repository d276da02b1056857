// The AdamW update of one element, one definition for host and device: the CPU backend's loop
// and the CUDA kernel call it, so both backends run the same formula.
#pragma once

#include <cmath>

#include "core/dtype/dtype.h"
#include "core/ops/backend.h"

namespace mantissa::core {

// AdamW's per-step constants, folded on the host once from AdamWParams (adamw_coefficients).
struct AdamWCoefficients {
  float lr;
  float beta1;
  float beta2;
  float eps;
  float weight_decay;
  float grad_scale;
  float bias_correction1;  // 1 - beta1^step
  float bias_correction2;  // 1 - beta2^step
};

// The bias corrections are computed in double: beta^step for large steps is far below
// 1 - FP32 epsilon long before it underflows, and pow in FP32 would lose digits first.
inline AdamWCoefficients adamw_coefficients(const AdamWParams& p) {
  return {
      p.lr,
      p.beta1,
      p.beta2,
      p.eps,
      p.weight_decay,
      p.grad_scale,
      static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta1), p.step)),
      static_cast<float>(1.0 - std::pow(static_cast<double>(p.beta2), p.step)),
  };
}

// One AdamW update, all in FP32; m and v are updated in place and the new parameter returned:
//   g = grad * grad_scale
//   m = beta1 m + (1 - beta1) g          v = beta2 v + (1 - beta2) g^2
//   m_hat = m / (1 - beta1^t)            v_hat = v / (1 - beta2^t)
//   param -= lr (m_hat / (sqrt(v_hat) + eps) + weight_decay param)
// The weight decay is decoupled (it acts on the parameter, not through the moments) and uses
// the parameter from before this step, as in PyTorch's AdamW. Division and sqrt are
// IEEE-rounded on both backends (nvcc's defaults without --use_fast_math).
//
// Nothing here checks for non-finite values: a NaN or inf gradient makes that element's m, v
// and parameter non-finite, and leaves every other element untouched. The trainer runs
// unscale_check_finite first and skips the whole step on every rank when any gradient is
// non-finite, so adamw never sees one in a normal run.
MANTISSA_HD float adamw_update(float param, float grad, float& m, float& v,
                               const AdamWCoefficients& k) {
  const float g = grad * k.grad_scale;
  m = k.beta1 * m + (1.0f - k.beta1) * g;
  v = k.beta2 * v + (1.0f - k.beta2) * g * g;
  const float m_hat = m / k.bias_correction1;
  const float v_hat = v / k.bias_correction2;
  return param - k.lr * (m_hat / (sqrtf(v_hat) + k.eps) + k.weight_decay * param);
}

}  // namespace mantissa::core
