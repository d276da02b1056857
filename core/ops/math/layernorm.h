// LayerNorm's per-element terms, one definition for host and device: the CPU backend's loops
// and the CUDA kernels call these (the row sums around them are each backend's own).
//
// With mean and var the mean and the biased variance of a row of C channels:
//   rstd = 1 / sqrt(var + eps),  xhat = (x - mean) rstd,  out = xhat gamma + beta
// and, with dnorm = dout gamma, the backward
//   dx = rstd (dnorm - mean(dnorm) - xhat mean(dnorm xhat))
//   dgamma += sum over rows of dout xhat,  dbeta += sum over rows of dout.
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype/dtype.h"

namespace mantissa::core {

inline constexpr float kLayerNormEps = 1e-5f;

// rstd from the sum of squared deviations of a row of C channels (the biased variance).
MANTISSA_HD float layernorm_rstd(float squared_deviations, int64_t C) {
  return 1.0f / sqrtf(squared_deviations / static_cast<float>(C) + kLayerNormEps);
}

MANTISSA_HD float layernorm_xhat(float x, float mean, float rstd) {
  return (x - mean) * rstd;
}

MANTISSA_HD float layernorm_out(float x, float mean, float rstd, float gamma, float beta) {
  return layernorm_xhat(x, mean, rstd) * gamma + beta;
}

// dx of one channel from its dnorm = dout gamma and xhat, given the row's mean(dnorm) and
// mean(dnorm xhat).
MANTISSA_HD float layernorm_dx(float dnorm, float xhat, float dnorm_mean, float dnorm_xhat_mean,
                               float rstd) {
  return (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * rstd;
}

}  // namespace mantissa::core
