// An FP8 GEMM operand with its scales, and the product of two of them in the layout every
// block-scaled FP8 GEMM takes: shared by the Linear layer's block recipes and the recipe
// benchmarks and tests.
#pragma once

#include "core/ops/backend.h"
#include "core/precision/block_scaling.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

// One FP8 GEMM operand as Backend::gemm takes it: the codes, and the dequantisation scales in
// `mode`'s layout (one element for kTensor).
struct Fp8Operand {
  Tensor codes;
  Tensor scale;
  ScaleMode mode = ScaleMode::kTensor;
};

// c = a b^T + beta c with both operands K-major (the TN layout that cuBLASLt requires for FP8
// on Hopper), each scaled per its mode.
inline void gemm_k_major(Backend& be, const Fp8Operand& a, const Fp8Operand& b, Tensor& c,
                         float beta = 0.0f) {
  GemmParams p;
  p.trans_b = true;
  p.beta = beta;
  p.a_scale = &a.scale;
  p.b_scale = &b.scale;
  p.a_scale_mode = a.mode;
  p.b_scale_mode = b.mode;
  be.gemm(a.codes, b.codes, c, p);
}

}  // namespace mantissa::core
