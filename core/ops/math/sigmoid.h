// The logistic sigmoid and its derivative's factor s (1 - s), one definition for host and
// device, shared by GELU (gelu.h: 0.5 (1 + tanh(u)) is sigmoid(2u)) and SwiGLU (swiglu.h).
#pragma once

#include <cmath>

#include "core/dtype/dtype.h"
#include "core/ops/math/exp_f32.h"

namespace mantissa::core {

// With e = exp(-|g|) (in (0, 1], so it never overflows) and t = 1 / (1 + e):
//   sigmoid(g) = t for g >= 0, e t for g < 0,      sigmoid(g) (1 - sigmoid(g)) = e t^2.
// Nothing cancels: 1 - sigmoid(g) would lose every digit for large g, and 1 + tanh(u) for
// negative u.
struct SigmoidTerms {
  float s;      // sigmoid(g)
  float s_1ms;  // sigmoid(g) (1 - sigmoid(g))
};

// 1 + e, rounded on its own. e is exp_f32's final product, and nvcc's PTX leaves ptxas free to
// fuse a product into the sum that takes it (CUDA 13's ptxas does not here: the sm_90 cubins
// built with and without --fmad are the same) unless the sum is __fadd_rn. GCC does not fuse
// it, since e has other uses. So both backends round the product and the sum separately.
MANTISSA_HD float one_plus(float e) {
#ifdef __CUDA_ARCH__
  return __fadd_rn(1.0f, e);
#else
  return 1.0f + e;
#endif
}

MANTISSA_HD SigmoidTerms sigmoid_terms(float g) {
  const float e = exp_f32(-fabsf(g));
  const float t = 1.0f / one_plus(e);
  return {t * (g >= 0.0f ? 1.0f : e), e * t * t};
}

}  // namespace mantissa::core
