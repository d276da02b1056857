// Rotary position embeddings (RoPE), one definition for host and device: the CPU backend's
// loops (cpu_rope.cpp) and the CUDA kernels (cuda_rope.cu) call these.
//
// Pairing: Hugging Face's rotate_half (LlamaForCausalLM, and what export/import must match):
// in a head of D channels (D even), channel i and channel i + D/2 form a pair, i < D/2, and
// rotate by the angle a = p * theta^(-2i/D) of position p:
//   out[i]       = x[i] cos a - x[i + D/2] sin a
//   out[i + D/2] = x[i + D/2] cos a + x[i] sin a
// The backward is the rotation by -a (the transpose of a rotation is its inverse):
//   dx[i]        = dout[i] cos a + dout[i + D/2] sin a
//   dx[i + D/2]  = dout[i + D/2] cos a - dout[i] sin a
// Each result is written as one explicit fmaf of the first product and the negated (or plain)
// second product, so that GCC and nvcc evaluate the same operations (neither can contract a
// sum of two products its own way) and the backends agree bit for bit.
#pragma once

#include <cmath>

#include "core/dtype/dtype.h"

namespace mantissa::core {

struct RopePair {
  float lo, hi;  // channel i and channel i + D/2
};

// The rotation by +a (forward) or, with sin_a negated, by -a (backward).
MANTISSA_HD RopePair rope_rotate(float lo, float hi, float cos_a, float sin_a) {
  return {fmaf(lo, cos_a, -(hi * sin_a)), fmaf(hi, cos_a, lo * sin_a)};
}

}  // namespace mantissa::core
