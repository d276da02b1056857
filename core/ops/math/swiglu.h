// SwiGLU, the gated MLP activation of Llama-style decoders, and its derivative, one definition
// for host and device: the CPU backend's loops (cpu_swiglu.cpp) and the CUDA kernels
// (cuda_swiglu.cu) call these, so the two evaluate the same operations and agree bit for bit.
// Every fused multiply-add is an explicit fmaf (below and in exp_f32), and the one other sum
// of a product (sigmoid.h's one_plus) cannot be fused, so no compiler has anything to contract
// (ptxas emits the same sm_90 code for cuda_swiglu.cu and cuda_elementwise.cu with and without
// --fmad).
//
//   out = silu(g) u,  silu(g) = g sigmoid(g)
//   dg = dout u silu'(g),  du = dout silu(g),  silu'(g) = s + g s (1 - s),  s = sigmoid(g).
#pragma once

#include <cmath>

#include "core/dtype/dtype.h"
#include "core/ops/math/sigmoid.h"

namespace mantissa::core {

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
