// RMSNorm's per-element terms, one definition for host and device: the CPU backend's loops
// (cpu_rmsnorm.cpp) and the CUDA kernels (cuda_rmsnorm.cu) call these; the row sums around
// them are each backend's own.
//
// Over a row of C channels (no mean is subtracted, no bias added, as Llama's RMSNorm):
//   rstd = 1 / sqrt(mean(x^2) + eps),  xhat = x rstd,  out = xhat gamma
// and, with dnorm = dout gamma, the backward
//   dx = rstd (dnorm - xhat mean(dnorm xhat)),  dgamma += sum over rows of dout xhat.
// (d xhat_j / d x_i = rstd (delta_ij - xhat_i xhat_j / C), since d rstd / d x_i is
// -rstd^3 x_i / C.)
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype/dtype.h"

namespace mantissa::core {

// rstd from the sum of squares of a row of C channels.
MANTISSA_HD float rmsnorm_rstd(float sum_squares, int64_t C, float eps) {
  return 1.0f / sqrtf(sum_squares / static_cast<float>(C) + eps);
}

MANTISSA_HD float rmsnorm_out(float x, float rstd, float gamma) {
  return x * rstd * gamma;
}

// dx of one channel from its dnorm = dout gamma and xhat = x rstd, given the row's
// mean(dnorm xhat).
MANTISSA_HD float rmsnorm_dx(float dnorm, float xhat, float dnorm_xhat_mean, float rstd) {
  return (dnorm - xhat * dnorm_xhat_mean) * rstd;
}

}  // namespace mantissa::core
