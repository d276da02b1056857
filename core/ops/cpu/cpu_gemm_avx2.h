// A packed AVX2/FMA GEMM that widens its operands to FP32 while it packs them (cpu_gemm.cpp's
// path for BF16, F16 and FP8 operands on CPUs without AVX512-BF16, or with
// MANTISSA_CPU_BF16_GEMM=0): no separate widening pass over the operands.
#pragma once

#include "core/ops/cpu/cpu_gemm_block_scales.h"
#include "core/ops/gemm_checks.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

// True for the operand pairs gemm_avx2 takes: F32, BF16 or F16 with itself, and the FP8
// pairs (E4M3 and E5M2 in any combination).
bool avx2_gemm_supports(DType a, DType b);

// c[i] = alpha * op(A[i]) op(B[i]) + beta * c[i] for each of the s.batch products, c being
// row-major [m, n] per product, FP32 or BF16 (c_dtype). Each element is one FP32 sum over
// k = 0 .. K-1 in that order, each step a fused multiply-add of the exactly widened operands
// (for BF16, F16 and FP8 operands the product is exact, so that is the plain FP32 sum of
// exact products); then alpha times the sum, plus beta * c in one more fused multiply-add;
// a BF16 c gets that rounded once to nearest even. So a result does not depend on the
// shape's blocking or on how many threads share the work. BLAS conventions: beta = 0 never
// reads c, and alpha = 0 or K = 0 reads neither A nor B (c becomes beta * c, or 0).
// Requires avx2_gemm_supports(A, B).
// With `scales` (one product, s.batch = 1) the sum is the block-scaled accumulator of
// cpu_gemm_block_scales.h, each K-block's sum in increasing k from +0 as above.
void gemm_avx2(const GemmShape& s, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
               float alpha, float beta, void* c, DType c_dtype,
               const BlockScales* scales = nullptr);

}  // namespace mantissa::core
