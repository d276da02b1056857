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
// starts at 0. The fma pins the rounding (one per block, whatever the compiler contracts);
// cuBLASLt does not document its order, so GPU results are compared within a tolerance.
//
// The partial sums come from the same engines as CpuBackend::gemm's per-tensor FP8 products:
//  - on CPUs with AVX512-BF16 (unless MANTISSA_CPU_BF16_GEMM=0), the native BF16 kernel
//    (cpu_gemm_bf16.cpp: exact products, FP32 sums; every FP8 value is a BF16 value) on the
//    codes regrouped into one contiguous K-major copy per K-block;
//  - otherwise OpenBLAS sgemm on the operands widened to K-major FP32 (exact).
// C is computed in slices of rows spread over the OpenMP threads; a slice's partial sum and
// accumulator stay in L2, each K-block is one single-threaded kernel call into the partial sum,
// folded into the accumulator at once (into C after the last block). No element's arithmetic
// depends on the slicing, so results do not depend on the thread count.
#include "core/ops/cpu/cpu_gemm_scaled.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_convert.h"
#include "core/ops/cpu/cpu_gemm_bf16.h"
#include "core/ops/cpu/scratch_buffer.h"

namespace mantissa::core {
namespace {

// Products below this many FLOPs run on one thread.
constexpr double kParallelFlops = 1 << 21;
// A slice's partial sum (and its accumulator) holds at most this many floats (1 MiB).
constexpr int64_t kSliceFloats = 1 << 18;

// op(X) as K-major FP32: out[i * k + kk] = element (i, kk). `k_major` says X is stored that
// way ([rows, k]); otherwise it is stored [k, rows] and is transposed through a table of the
// 256 codes.
void widen_k_major(const Tensor& x, bool k_major, int64_t rows, int64_t k, float* out) {
  if (k_major) {
    widen_to_f32(x.data(), x.dtype(), out, rows * k);
    return;
  }
  uint8_t codes[256];
  float table[256];
  for (int i = 0; i < 256; ++i) codes[i] = static_cast<uint8_t>(i);
  widen_to_f32(codes, x.dtype(), table, 256);
  const auto* in = static_cast<const uint8_t*>(x.data());
  constexpr int64_t kRowBlock = 64;
  const int64_t row_blocks = (rows + kRowBlock - 1) / kRowBlock;
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 16))
  for (int64_t block = 0; block < row_blocks; ++block) {
    const int64_t i0 = block * kRowBlock;
    const int64_t i1 = std::min(rows, i0 + kRowBlock);
    for (int64_t kk = 0; kk < k; ++kk) {
      const uint8_t* src = in + kk * rows;
      for (int64_t i = i0; i < i1; ++i) out[i * k + kk] = table[src[i]];
    }
  }
}

// The codes of op(X) regrouped by K-block: out[b] is [rows, width_b] K-major (width_b = block_k
// but for a shorter last block), starting at out + b * rows * block_k. `k_major` as above.
void regroup_codes(const Tensor& x, bool k_major, int64_t rows, int64_t k, int64_t block_k,
                   uint8_t* out) {
  const auto* in = static_cast<const uint8_t*>(x.data());
  const int64_t blocks = (k + block_k - 1) / block_k;
#pragma omp parallel for schedule(static) if (rows * k >= (1 << 18))
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t k0 = b * block_k, width = std::min(block_k, k - k0);
      uint8_t* dst = out + b * rows * block_k + i * width;
      if (k_major) {
        std::memcpy(dst, in + i * k + k0, static_cast<size_t>(width));
      } else {
        for (int64_t kk = 0; kk < width; ++kk) dst[kk] = in[(k0 + kk) * rows + i];
      }
    }
  }
}

// scales[b * rows + i] = the scale of row i in K-block b, as an F32 multiplier.
void decode_scales(const Tensor& scale, ScaleMode mode, int64_t rows, int64_t k, int64_t k_blocks,
                   float* out) {
  for (int64_t b = 0; b < k_blocks; ++b) {
    for (int64_t i = 0; i < rows; ++i) {
      out[b * rows + i] = scale_at(scale.data(), mode, scale_index(mode, rows, k, i, b));
    }
  }
}

}  // namespace

void gemm_block_scaled(const GemmShape& s, const Tensor& a, const Tensor& b, Tensor& c,
                       const GemmParams& p) {
  const int64_t M = s.m, N = s.n, K = s.k;
  if (M == 0 || N == 0) return;
  const int64_t block_k = scale_block_k(p.a_scale_mode, K);
  // BLAS conventions: with alpha = 0 (or K = 0) A and B are not read, C = beta * C.
  const int64_t k_blocks = p.alpha == 0.0f ? 0 : scale_k_blocks(p.a_scale_mode, K);

  // The operands as the partial-sum engine reads them (see the top).
  const bool native =
      k_blocks > 0 && bf16_gemm_enabled() && bf16_gemm_supports(a.dtype(), b.dtype());
  thread_local ScratchBuffer<float> a_wide, b_wide;
  thread_local ScratchBuffer<uint8_t> a_blocks, b_blocks;
  float* a32 = nullptr;
  float* b32 = nullptr;
  uint8_t* a8 = nullptr;
  uint8_t* b8 = nullptr;
  if (native) {
    a8 = a_blocks.get(M * k_blocks * block_k);
    b8 = b_blocks.get(N * k_blocks * block_k);
    regroup_codes(a, !p.trans_a, M, K, block_k, a8);
    regroup_codes(b, p.trans_b, N, K, block_k, b8);
  } else if (k_blocks > 0) {
    a32 = a_wide.get(M * K);
    b32 = b_wide.get(N * K);
    widen_k_major(a, !p.trans_a, M, K, a32);
    widen_k_major(b, p.trans_b, N, K, b32);
  }
  std::vector<float> sa(static_cast<size_t>(k_blocks * M));
  std::vector<float> sb(static_cast<size_t>(k_blocks * N));
  decode_scales(*p.a_scale, p.a_scale_mode, M, K, k_blocks, sa.data());
  decode_scales(*p.b_scale, p.b_scale_mode, N, K, k_blocks, sb.data());

  const int64_t slice = std::clamp<int64_t>(kSliceFloats / N, 8, 512);
  const int64_t slices = (M + slice - 1) / slice;
  const bool parallel =
      omp_get_max_threads() > 1 && slices > 1 &&
      2.0 * static_cast<double>(M) * static_cast<double>(N) * static_cast<double>(K) >=
          kParallelFlops;
  // The sgemms run inside our own threads; OpenBLAS's pool must stay out (see cpu_gemm.cpp).
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  const bool f32_out = c.dtype() == DType::kF32;

#pragma omp parallel for schedule(static) if (parallel)
  for (int64_t piece = 0; piece < slices; ++piece) {
    thread_local ScratchBuffer<float> partial_buffer, acc_buffer;
    const int64_t i0 = piece * slice;
    const int64_t rows = std::min(slice, M - i0);
    float* partial = partial_buffer.get(rows * N);
    float* acc = acc_buffer.get(rows * N);
    // C[i, j] = alpha * v + beta * C[i, j], v the accumulated sum (the old C unread at beta 0).
    const auto store = [&](int64_t r, const float* v) {
      if (f32_out) {
        float* cr = c.data_as<float>() + (i0 + r) * N;
        for (int64_t j = 0; j < N; ++j) {
          cr[j] = p.beta == 0.0f ? p.alpha * v[j] : std::fma(p.beta, cr[j], p.alpha * v[j]);
        }
      } else {
        bf16* cr = c.data_as<bf16>() + (i0 + r) * N;
        for (int64_t j = 0; j < N; ++j) {
          const float out = p.beta == 0.0f ? p.alpha * v[j]
                                           : std::fma(p.beta, bf16_to_float(cr[j]), p.alpha * v[j]);
          cr[j] = bf16_from_float(out);
        }
      }
    };
    if (k_blocks == 0) {
      std::fill_n(acc, N, 0.0f);
      for (int64_t r = 0; r < rows; ++r) store(r, acc);
      continue;
    }
    for (int64_t blk = 0; blk < k_blocks; ++blk) {
      const int64_t k0 = blk * block_k;
      const int64_t width = std::min(block_k, K - k0);
      if (native) {
        // Rows [i0, i0 + rows) of op(A)'s block and all of op(B)^T's, contiguous K-major.
        const Tensor a_block =
            Tensor::wrap(a8 + blk * M * block_k + i0 * width, Shape{rows, width}, a.dtype());
        const Tensor b_block = Tensor::wrap(b8 + blk * N * block_k, Shape{N, width}, b.dtype());
        gemm_bf16(GemmShape{1, rows, N, width}, a_block, false, b_block, true, 1.0f, 0.0f, partial);
      } else {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows),
                    static_cast<int>(N), static_cast<int>(width), 1.0f, a32 + i0 * K + k0,
                    static_cast<int>(K), b32 + k0, static_cast<int>(K), 0.0f, partial,
                    static_cast<int>(N));
      }
      const float* sb_block = sb.data() + blk * N;
      // The first block starts from acc = +0 (fma(x, y, +0) is that sum); after the last the
      // accumulated row goes to C, in the same pass.
      const bool first = blk == 0, last = blk + 1 == k_blocks;
      for (int64_t r = 0; r < rows; ++r) {
        const float sa_row = sa[static_cast<size_t>(blk * M + i0 + r)];
        float* pr = partial + r * N;
        float* ar = acc + r * N;
        if (first) {
          for (int64_t j = 0; j < N; ++j) pr[j] = std::fma(sa_row * sb_block[j], pr[j], 0.0f);
        } else {
          for (int64_t j = 0; j < N; ++j) pr[j] = std::fma(sa_row * sb_block[j], pr[j], ar[j]);
        }
        if (last) {
          store(r, pr);
        } else {
          std::copy_n(pr, N, ar);
        }
      }
    }
  }
}

std::string CpuBackend::unsupported_scale_modes(ScaleMode a, ScaleMode b) const {
  // The CPU runs every pair cuBLASLt defines (MXFP8 included, which GPUs run on sm_100+ only).
  const char* rule = scale_mode_pair_rule(a, b);
  return rule == nullptr ? std::string() : std::string(rule);
}

}  // namespace mantissa::core
