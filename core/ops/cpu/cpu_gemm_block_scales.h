// The scaled-accumulate epilogue of the CPU GEMM engines (cpu_gemm_bf16.h, cpu_gemm_avx2.h),
// with which they compute the block-scaled FP8 GEMM of cpu_gemm_scaled.cpp in one call.
//
// With scales, an engine cuts K into blocks of block_k (the last one shorter; one block when
// block_k >= K) and, for each element, sums each block's exact products in FP32 from 0 (in
// the engine's own order, as it sums all of K without scales) into P_b, and folds P_b into an
// FP32 accumulator while the tile is still in registers or L1:
//   acc = fma(sa(i, b) * sb(j, b), P_b, acc)   for b = 0, 1, ..., L - 1, acc starting at +0,
// the first block included (fma(x, y, +0) rather than x * y: a -0 product becomes +0). Then
// C = alpha * acc, plus beta * C in one more fma (beta = 0: C is not read), rounded once to
// nearest even for a BF16 C: the engine's usual finish with acc for the sum.
#pragma once

#include <cstdint>

namespace mantissa::core {

// Entries each K-block's scales must have past the last row (column): edge tiles compute
// whole tiles and read the scales of rows and columns they then discard.
inline constexpr int64_t kBlockScalePadding = 64;

// The multipliers of one block-scaled product, decoded to F32.
struct BlockScales {
  int64_t block_k;   // elements of K per block; even, or at least K (one block)
  const float* a;    // a[b * a_stride + i]: the scale of op(A)'s row i in K-block b
  int64_t a_stride;  // at least m + kBlockScalePadding
  const float* b;    // b[b * b_stride + j]: the scale of op(B)^T's row j (C's column j)
  int64_t b_stride;  // at least n + kBlockScalePadding
};

}  // namespace mantissa::core
