// exp(x) in FP32 as straight-line arithmetic, one definition for host and device.
//
// libm's expf is a call GCC cannot vectorise without -ffast-math, and CUDA's expf is another
// function than the C library's, so every exp the backends evaluate is this one: the softmax
// of attention and cross-entropy, GELU and SwiGLU. The CPU's loops vectorise it, and both
// backends evaluate it with the same operations. Every product that feeds a sum is an
// explicit fmaf, so the result does not depend on which products a compiler would contract on
// its own (GCC does so only when optimising with -O2 and up, nvcc by its own rules).
#pragma once

#include <cmath>
#include <cstdint>

#include "core/dtype/dtype.h"

namespace mantissa::core {

// exp(x) to within 1.03 ulp of the exact value (tests/core/test_exp_f32.cpp). The classic
// Cody-Waite scheme: x = n ln2 + r with |r| <= ln2/2, exp(r) from a degree-7 polynomial (the
// Cephes coefficients), times 2^n. 2^n is applied as two factors 2^(n/2) 2^(n - n/2), each a
// normal float, so that results beyond the float range overflow to inf or underflow (through
// the subnormals) to 0 by themselves. A NaN is passed through as it came.
MANTISSA_HD float exp_f32(float x) {
  // Beyond these bounds exp is inf / 0 in FP32 anyway; they keep n within [-150, 129].
  float xc = x < 89.0f ? x : 89.0f;
  xc = xc > -104.0f ? xc : -104.0f;
  // Round x / ln2 to an integer by adding and subtracting 1.5 * 2^23 (exact, no libm call).
  const float n = fmaf(xc, 1.44269504088896341f, 12582912.0f) - 12582912.0f;
  // ln2 split into a part with few bits (so n * 0.693359375 is exact) and a correction:
  // r = (x - n 0.693359375) + n 2.12194440e-4.
  const float r = fmaf(n, 2.12194440e-4f, fmaf(-n, 0.693359375f, xc));
  float p = 1.9875691500e-4f;
  p = fmaf(p, r, 1.3981999507e-3f);
  p = fmaf(p, r, 8.3334519073e-3f);
  p = fmaf(p, r, 4.1665795894e-2f);
  p = fmaf(p, r, 1.6666665459e-1f);
  p = fmaf(p, r, 5.0000001201e-1f);
  p = fmaf(p * r, r, r) + 1.0f;  // p r^2 + r + 1
  const int32_t n_half = static_cast<int32_t>(n) >> 1;
  const int32_t n_rest = static_cast<int32_t>(n) - n_half;
  const float two_half = bits_to_float(static_cast<uint32_t>(n_half + 127) << 23);
  const float two_rest = bits_to_float(static_cast<uint32_t>(n_rest + 127) << 23);
  const float y = p * two_half * two_rest;
  return x == x ? y : x;  // the clamps took a NaN for 89
}

}  // namespace mantissa::core
