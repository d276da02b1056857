// The CPU's block-scaled FP8 GEMM: what cuBLASLt defines for its scale modes
// (core/precision/block_scaling.h).
//
// For every K-block b (128 elements of K for 1x128 and 128x128 scales, 32 for MXFP8, all of K
// for per-row scales) the partial sum P_b[i, j] = sum over k in b of a(i, k) b(k, j), exact
// products of the codes summed in FP32, is multiplied by the block's two scales and
// accumulated in FP32:
//   acc[i, j] = fma(sa(i, b) * sb(j, b), P_b[i, j], acc[i, j])   for b = 0, 1, ..., L - 1,
//   C[i, j]   = round(fma(beta, C[i, j], alpha * acc[i, j]))     (beta = 0: C is not read)
// where sa(i, b) scales op(A)'s row i in K-block b and sb(j, b) op(B)^T's row j, and acc
// starts at +0 (the first block is an fma onto +0 too, so a -0 product becomes +0). The fma pins
// the rounding (one per block, whatever the compiler contracts); cuBLASLt does not document its
// order, so GPU results are compared within a tolerance.
//
// Both engines of CpuBackend::gemm's per-tensor FP8 products compute this in one call, with
// the scaled-accumulate epilogue of cpu_gemm_block_scales.h: the operands are packed (and the
// codes widened) once over all of K as without scales, and each micro-tile folds every
// K-block's sums into its accumulator while the tile is in registers or L1:
//  - on CPUs with AVX512-BF16 (unless MANTISSA_CPU_BF16_GEMM=0), the native BF16 kernel
//    (cpu_gemm_bf16.cpp: exact products, FP32 sums over k = 1, 0, 3, 2, ... of the block;
//    every FP8 value is a BF16 value);
//  - otherwise the AVX2/FMA kernel (cpu_gemm_avx2.cpp: the codes widened to FP32 exactly,
//    FP32 sums over k in increasing order).
// No element's arithmetic depends on how the engines share the work, so results do not depend
// on the thread count.
#include "core/ops/cpu/cpu_gemm_scaled.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_gemm_avx2.h"
#include "core/ops/cpu/cpu_gemm_bf16.h"
#include "core/ops/cpu/cpu_gemm_block_scales.h"

namespace mantissa::core {
namespace {

// out[b * stride + i] = the scale of row i in K-block b, as an F32 multiplier; the padding
// past `rows` (stride - rows entries per block) holds 1.
void decode_scales(const Tensor& scale, ScaleMode mode, int64_t rows, int64_t k, int64_t k_blocks,
                   int64_t stride, float* out) {
#pragma omp parallel for schedule(static) if (rows * k_blocks >= (1 << 15))
  for (int64_t b = 0; b < k_blocks; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      out[b * stride + i] = scale_at(scale.data(), mode, scale_index(mode, rows, k, i, b));
    }
    std::fill(out + b * stride + rows, out + (b + 1) * stride, 1.0f);
  }
}

// C = beta * C, what alpha = 0 or K = 0 leaves (C[i, j] = round(fma(beta, C, alpha * 0)), the
// old C unread at beta = 0).
void scale_only(const GemmParams& p, Tensor& c) {
  const int64_t n = c.numel();
  const float zero = p.alpha * 0.0f;
  if (c.dtype() == DType::kF32) {
    float* cr = c.data_as<float>();
    for (int64_t i = 0; i < n; ++i) cr[i] = p.beta == 0.0f ? zero : std::fma(p.beta, cr[i], zero);
    return;
  }
  bf16* cr = c.data_as<bf16>();
  for (int64_t i = 0; i < n; ++i) {
    cr[i] = bf16_from_float(p.beta == 0.0f ? zero : std::fma(p.beta, bf16_to_float(cr[i]), zero));
  }
}

}  // namespace

void gemm_block_scaled(const GemmShape& s, const Tensor& a, const Tensor& b, Tensor& c,
                       const GemmParams& p) {
  const int64_t M = s.m, N = s.n, K = s.k;
  if (M == 0 || N == 0) return;
  // BLAS conventions: with alpha = 0 (or K = 0) A and B are not read, C = beta * C.
  const int64_t k_blocks = p.alpha == 0.0f ? 0 : scale_k_blocks(p.a_scale_mode, K);
  if (k_blocks == 0) return scale_only(p, c);

  const int64_t a_stride = M + kBlockScalePadding, b_stride = N + kBlockScalePadding;
  std::vector<float> sa(static_cast<size_t>(k_blocks * a_stride));
  std::vector<float> sb(static_cast<size_t>(k_blocks * b_stride));
  decode_scales(*p.a_scale, p.a_scale_mode, M, K, k_blocks, a_stride, sa.data());
  decode_scales(*p.b_scale, p.b_scale_mode, N, K, k_blocks, b_stride, sb.data());
  const BlockScales scales{scale_block_k(p.a_scale_mode, K), sa.data(), a_stride, sb.data(),
                           b_stride};
  if (bf16_gemm_enabled() && bf16_gemm_supports(a.dtype(), b.dtype())) {
    gemm_bf16(s, a, p.trans_a, b, p.trans_b, p.alpha, p.beta, c.data(), c.dtype(), &scales);
  } else {
    gemm_avx2(s, a, p.trans_a, b, p.trans_b, p.alpha, p.beta, c.data(), c.dtype(), &scales);
  }
}

std::string CpuBackend::unsupported_scale_modes(ScaleMode a, ScaleMode b) const {
  // The CPU runs every pair cuBLASLt defines (MXFP8 included, which GPUs run on sm_100+ only).
  const char* rule = scale_mode_pair_rule(a, b);
  return rule == nullptr ? std::string() : std::string(rule);
}

}  // namespace mantissa::core
