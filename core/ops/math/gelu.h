// GELU (the tanh approximation) and its derivative, one definition for host and device: the
// CPU backend's loops and the CUDA kernels call these, so the two evaluate the same formula
// with the same operations.
#pragma once

#include <cmath>

#include "core/dtype/dtype.h"
#include "core/ops/math/sigmoid.h"

namespace mantissa::core {

inline constexpr float kGeluSqrt2OverPi = 0.79788456080286536f;
inline constexpr float kGeluCubic = 0.044715f;

// GELU is 0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), and 0.5 (1 + tanh(u))
// is the logistic sigmoid of 2u, which sigmoid.h evaluates without cancellation: the tail of
// gelu keeps full relative precision down to the FP32 subnormals.
MANTISSA_HD SigmoidTerms gelu_terms(float x) {
  const float u = kGeluSqrt2OverPi * fmaf(kGeluCubic * x * x, x, x);
  return sigmoid_terms(2.0f * u);
}

// gelu(x) = x sigmoid(2u). +inf gives +inf; -inf and NaN give NaN.
MANTISSA_HD float gelu(float x) {
  return x * gelu_terms(x).s;
}

// d/dx [x sigmoid(2u)] = sigmoid(2u) + 2 x sigmoid(2u) (1 - sigmoid(2u)) du/dx, with
// du/dx = sqrt(2/pi) (1 + 3 * 0.044715 x^2). Outside [-10, 10] gelu' is 0 or 1 to within
// 1e-35, so x is clamped there: for huge |x| the second term would be 0 * inf. The clamp
// lets NaN through (NaN in, NaN out) and maps +-inf to the limits.
//
// Every product that feeds a sum, here, in gelu_terms and in exp_f32, is an explicit fmaf (and
// sigmoid.h's one_plus is never fused), so that no compiler chooses which product to fuse:
// left to themselves, GCC (x86-64-v3) fuses the final sum with the last product of the second
// term and nvcc with the product that makes sigmoid(2u) (e t), GCC fuses nothing below -O2,
// and the results would differ in the last bit (test_cpu_elementwise and
// tests/gpu/test_gpu_ops.cpp compare bits).
MANTISSA_HD float gelu_grad(float x) {
  const float xc = x > 10.0f ? 10.0f : (x < -10.0f ? -10.0f : x);
  const SigmoidTerms g = gelu_terms(xc);
  const float du = kGeluSqrt2OverPi * fmaf(3.0f * kGeluCubic * xc, xc, 1.0f);
  return fmaf(2.0f * xc * g.s_1ms, du, g.s);
}

}  // namespace mantissa::core
