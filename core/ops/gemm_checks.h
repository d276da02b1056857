// Validation of Backend::gemm calls, shared by every backend so that a bad call fails the
// same way everywhere (naming "gemm", the operand and the shapes).
//
// The dtype contract (cuBLASLt's type table with CUBLAS_COMPUTE_32F, which the CPU follows):
//   A x B                       C
//   F32 x F32                   F32
//   BF16 x BF16                 F32, BF16
//   F16 x F16                   F32, F16
//   E4M3 x E4M3                 F32, BF16, E4M3            (beta = 0 for FP8 C)
//   E4M3 x E5M2, E5M2 x E4M3    F32, BF16, E4M3, E5M2
// E5M2 x E5M2 has no kernel on Hopper and is rejected. a_scale / b_scale apply to FP8
// operands only, c_scale / c_amax to an FP8 output only. C must not overlap A or B.
// Block-scaled FP8 (scale modes other than kTensor, core/precision/block_scaling.h): a pair
// of modes cuBLASLt defines, 2-D operands, C F32 or BF16, no fast accumulation, scale tensors
// of exactly the layout's size, and rows (M, N) a multiple of scale_rows_multiple (8 for 1x128, 4
// for 128x128).
#pragma once

#include <cstdint>

#include "core/ops/backend.h"

namespace mantissa::core {

// One call is `batch` independent products op(A)[m, k] op(B)[k, n] = C[m, n].
struct GemmShape {
  int64_t batch = 1;
  int64_t m = 0;
  int64_t n = 0;
  int64_t k = 0;
};

GemmShape check_gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p,
                     Device device);

}  // namespace mantissa::core
