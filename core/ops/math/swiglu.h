// SwiGLU, the gated MLP activation of Llama-style decoders, and its derivative, one definition
// for host and device: the CPU backend's loops (cpu_swiglu.cpp) and the CUDA kernels
// (cuda_swiglu.cu) call these, so the two evaluate the same operations and agree bit for bit.
// Every fused multiply-add is an explicit fmaf (below and in exp_f32), and no other product
// feeds a sum, so no compiler has anything to contract (ptxas emits the same code for
// cuda_swiglu.cu with --fmad=false for sm_80 and sm_90).
//
//   out = silu(g) u,  silu(g) = g sigmoid(g)
//   dg = dout u silu'(g),  du = dout silu(g),  silu'(g) = s + g s (1 - s),  s = sigmoid(g).
#pragma once

#include <cmath>

#include "core/dtype/dtype.h"
#include "core/ops/math/exp_f32.h"

namespace mantissa::core {

// With e = exp(-|g|) (in (0, 1], so it never overflows) and t = 1 / (1 + e):
//   sigmoid(g) = t for g >= 0, e t for g < 0,      sigmoid(g) (1 - sigmoid(g)) = e t^2.
// Nothing cancels (1 - sigmoid(g) would lose every digit for large g), and neither backend
// can contract anything here: these are products and one division.
struct SigmoidTerms {
  float s;      // sigmoid(g)
  float s_1ms;  // sigmoid(g) (1 - sigmoid(g))
};

MANTISSA_HD SigmoidTerms sigmoid_terms(float g) {
  const float e = exp_f32(-fabsf(g));
  const float t = 1.0f / (1.0f + e);
  return {t * (g >= 0.0f ? 1.0f : e), e * t * t};
}

MANTISSA_HD float silu(float g) {
  return g * sigmoid_terms(g).s;
}

MANTISSA_HD float swiglu_out(float g, float u) {
  return silu(g) * u;
}

// silu'(g) = s + g s (1 - s), as an explicit fmaf so that GCC and nvcc fuse the same product.
// Outside [-100, 100] silu' is 0 or 1 to within 1e-40, so g is clamped there: for infinite g
// the second term would be inf * 0. The clamp lets NaN through and maps +-inf to the limits.
MANTISSA_HD float silu_grad(float g) {
  const float gc = g > 100.0f ? 100.0f : (g < -100.0f ? -100.0f : g);
  const SigmoidTerms k = sigmoid_terms(gc);
  return fmaf(gc, k.s_1ms, k.s);
}

}  // namespace mantissa::core
