// CudaBackend::quantize_blocks: block quantisation by the rules of
// core/precision/block_scaling.h, with the same scalar functions as the CPU backend, so the
// codes and scales agree bit for bit.
//
// Each block is read twice, for its amax and then for its codes (the second read comes from
// L1 or L2), by one of four kernels chosen so that a warp's loads and stores cover
// consecutive addresses:
//  - 1x128 and 1x32 (MXFP8) blocks of src's rows: one warp per 128 elements of a row, lane l
//    taking elements l, l + 32, l + 64 and l + 96; the warp reduces the amax of the one 1x128
//    block, or of each 1x32 block (one per step of 32).
//  - one scale per row of src: one warp per row, its lanes striding the row.
//  - any of those along src's columns (a transposed operand, src[K, outer], as the weight
//    gradient's operands are: up to a few thousand rows of K = tokens): a 32 x 32 block takes
//    32 operand rows over one K-block, its 32 warps splitting the K-block and each reading 32
//    consecutive elements of a src row; the rows' amaxes are reduced in shared memory and the
//    codes written through a shared 32 x 32 tile.
//  - 128x128 blocks: one 128-thread block per (row block, K-block). Each thread walks one
//    line of the tile along src's rows so that the 128 threads read each src row coalesced,
//    the amax is a block reduction, and every thread then writes its line's codes.
// The tensor-wide amax (when asked for) is an atomicMax on the magnitude bits, which order
// like the magnitudes with every NaN (made canonical) above inf.
#include <cuda_runtime.h>

#include "core/error.h"
#include "core/int_math.h"
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/quantize_checks.h"

namespace mantissa::core {
namespace {

using cuda_kernels::abs_bits;
using cuda_kernels::block_max_u32;

constexpr const char* kOp = "quantize_blocks";

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) {
  return a < b ? a : b;
}
__device__ __forceinline__ uint32_t max32(uint32_t a, uint32_t b) {
  return a > b ? a : b;
}

// Element (i, k) of the operand: src[i, k], or src[k, i] when transposed.
template <class Src>
__device__ __forceinline__ float operand_at(const Src* src, bool transpose, int64_t outer,
                                            int64_t k, int64_t i, int64_t kk) {
  return to_float(transpose ? src[kk * outer + i] : src[i * k + kk]);
}

// The scale of a block whose amax is `amax` (E8M0's value with `mx`), stored at `index` when
// `store` (the one thread of several computing it that writes it).
template <class Code>
__device__ __forceinline__ float scale_for(float amax, bool mx, bool power_of_two, void* scales,
                                           int64_t index, bool store = true) {
  if (mx) {
    const uint8_t e = mx_scale_e8m0(amax, fp8_format_max<Code>());
    if (store) static_cast<uint8_t*>(scales)[index] = e;
    return e8m0_to_float(e);
  }
  const float s = block_scale(amax, fp8_format_max<Code>(), power_of_two);
  if (store) static_cast<float*>(scales)[index] = s;
  return s;
}

// Warp w of the grid-stride loop, and the number of warps in the grid.
__device__ __forceinline__ int64_t global_warp_index() {
  return cuda_kernels::global_thread_index() / cuda_kernels::kWarpSize;
}
__device__ __forceinline__ int64_t grid_warps() {
  return cuda_kernels::grid_stride() / cuda_kernels::kWarpSize;
}

constexpr int kChunk = 128;  // elements of a row a warp takes per step: four per lane

// Untransposed 1x128 (kMx false) or 1x32 E8M0 (kMx true) blocks: warp w takes chunk c of row
// i (elements [128 c, 128 c + 128)), lane l its elements 128 c + l + 32 j, j < 4. Element j of
// every lane lies in the chunk's one 1x128 block, or in 1x32 block 4 c + j. Every lane
// reduces the same amax and computes the same scale; lane 0 stores it.
template <class Src, class Code, bool kMx>
__global__ void quantize_chunks_kernel(const Src* __restrict__ src, Code* __restrict__ codes,
                                       void* __restrict__ scales, uint32_t* __restrict__ amax,
                                       int64_t outer, int64_t k, bool power_of_two) {
  constexpr ScaleMode mode = kMx ? ScaleMode::kVec32Ue8m0 : ScaleMode::kVec128;
  const int lane = threadIdx.x % cuda_kernels::kWarpSize;
  const int64_t chunks_per_row = ceil_div(k, kChunk);
  uint32_t seen = 0;
  for (int64_t w = global_warp_index(); w < outer * chunks_per_row; w += grid_warps()) {
    const int64_t i = w / chunks_per_row;
    const int64_t base = (w % chunks_per_row) * kChunk;
    float x[4];
    uint32_t bits[4];
    for (int j = 0; j < 4; ++j) {
      const int64_t e = base + lane + 32 * j;
      x[j] = e < k ? to_float(src[i * k + e]) : 0.0f;
      bits[j] = e < k ? abs_bits(x[j]) : 0u;
    }
    float s[4];
    if constexpr (kMx) {
      for (int j = 0; j < 4; ++j) {
        const uint32_t m = cuda_kernels::warp_max_u32(bits[j]);
        seen = max32(seen, m);
        const int64_t b = base / 32 + j;
        s[j] = scale_for<Code>(bits_to_float(m), true, power_of_two, scales,
                               scale_index(mode, outer, k, i, b), lane == 0 && b * 32 < k);
      }
    } else {
      const uint32_t m =
          cuda_kernels::warp_max_u32(max32(max32(bits[0], bits[1]), max32(bits[2], bits[3])));
      seen = max32(seen, m);
      s[0] = scale_for<Code>(bits_to_float(m), false, power_of_two, scales,
                             scale_index(mode, outer, k, i, base / kChunk), lane == 0);
      s[1] = s[2] = s[3] = s[0];
    }
    for (int j = 0; j < 4; ++j) {
      const int64_t e = base + lane + 32 * j;
      if (e < k) codes[i * k + e] = quantize_with_scale<Code>(x[j], s[j]);
    }
  }
  // `seen` is warp-uniform: one atomic per warp.
  if (amax != nullptr && lane == 0) atomicMax(amax, seen);
}

// One scale per row of an untransposed src: warp w takes row w, its lanes striding the row.
template <class Src, class Code>
__global__ void quantize_whole_rows_kernel(const Src* __restrict__ src, Code* __restrict__ codes,
                                           float* __restrict__ scales, uint32_t* __restrict__ amax,
                                           int64_t outer, int64_t k, bool power_of_two) {
  const int lane = threadIdx.x % cuda_kernels::kWarpSize;
  uint32_t seen = 0;
  for (int64_t i = global_warp_index(); i < outer; i += grid_warps()) {
    const Src* row = src + i * k;
    uint32_t bits = 0;
    for (int64_t e = lane; e < k; e += cuda_kernels::kWarpSize) {
      bits = max32(bits, abs_bits(to_float(row[e])));
    }
    const uint32_t m = cuda_kernels::warp_max_u32(bits);
    seen = max32(seen, m);
    const float s = scale_for<Code>(bits_to_float(m), false, power_of_two, scales,
                                    scale_index(ScaleMode::kOuterVec, outer, k, i, 0), lane == 0);
    for (int64_t e = lane; e < k; e += cuda_kernels::kWarpSize) {
      codes[i * k + e] = quantize_with_scale<Code>(to_float(row[e]), s);
    }
  }
  if (amax != nullptr && lane == 0) atomicMax(amax, seen);
}

constexpr int kTile = 128;

// Grid: (row blocks, K-blocks); 128 threads. Thread t walks line t of the tile: without the
// transpose the operand's column k0 + t (src's rows are the operand's rows), with it the
// operand's row i0 + t; either way consecutive threads read consecutive src addresses.
template <class Src, class Code>
__global__ void quantize_square_kernel(const Src* __restrict__ src, Code* __restrict__ codes,
                                       float* __restrict__ scales, uint32_t* __restrict__ amax,
                                       int64_t outer, int64_t k, bool transpose,
                                       bool power_of_two) {
  const int64_t i0 = static_cast<int64_t>(blockIdx.x) * kTile;
  const int64_t b = blockIdx.y;
  const int64_t k0 = b * kTile;
  const int64_t rows = min64(kTile, outer - i0);
  const int64_t width = min64(kTile, k - k0);
  const int t = threadIdx.x;
  // Line t: `steps` elements (i, kk) with one index fixed to t.
  const bool line_is_row = transpose;
  const int64_t fixed = line_is_row ? i0 + t : k0 + t;
  const bool active = line_is_row ? t < rows : t < width;
  const int64_t steps = line_is_row ? width : rows;
  uint32_t bits = 0;
  if (active) {
    for (int64_t step = 0; step < steps; ++step) {
      const int64_t i = line_is_row ? fixed : i0 + step;
      const int64_t kk = line_is_row ? k0 + step : fixed;
      bits = max32(bits, abs_bits(operand_at(src, transpose, outer, k, i, kk)));
    }
  }
  bits = block_max_u32(bits);
  const float s = block_scale(bits_to_float(bits), fp8_format_max<Code>(), power_of_two);
  if (t == 0) {
    scales[scale_index(ScaleMode::kBlock128, outer, k, i0, b)] = s;
    if (amax != nullptr) atomicMax(amax, bits);
  }
  if (!active) return;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t i = line_is_row ? fixed : i0 + step;
    const int64_t kk = line_is_row ? k0 + step : fixed;
    codes[i * k + kk] = quantize_with_scale<Code>(operand_at(src, transpose, outer, k, i, kk), s);
  }
}

constexpr int kLines = 32;

// A transposed operand (operand row i is src column i) in 1x128, 1x32 E8M0 or whole-row blocks
// along K. Grid: (K-blocks, ceil(outer / 32)) blocks of 32 x 32 threads; block (b, r) takes
// operand rows i0 = 32 r ... i0 + 31 over K-block b, [k0, k1). Thread (x, y) reads column
// i0 + x of src rows k0 + y, + 32, ..., so that warp y reads 32 consecutive elements of a src
// row; the rows' amaxes are reduced in shared memory, and the codes go out through a shared
// 32 x 32 tile so that each warp writes 32 consecutive bytes of one code row.
template <class Src, class Code>
__global__ void __launch_bounds__(kLines* kLines)
    quantize_transposed_kernel(const Src* __restrict__ src, Code* __restrict__ codes,
                               void* __restrict__ scales, uint32_t* __restrict__ amax,
                               int64_t outer, int64_t k, ScaleMode mode, bool power_of_two) {
  __shared__ uint32_t partial[kLines][kLines + 1];
  __shared__ float row_scale[kLines];
  __shared__ Code tile[kLines][kLines + 1];
  const bool mx = mode == ScaleMode::kVec32Ue8m0;
  const int x = threadIdx.x, y = threadIdx.y;
  const int64_t b = blockIdx.x;
  const int64_t k0 = b * scale_block_k(mode, k);
  const int64_t k1 = min64(k, k0 + scale_block_k(mode, k));
  const int64_t i0 = static_cast<int64_t>(blockIdx.y) * kLines;
  const int64_t i = i0 + x;
  const bool active = i < outer;

  uint32_t bits = 0;
  if (active) {
    for (int64_t kk = k0 + y; kk < k1; kk += kLines) {
      bits = max32(bits, abs_bits(to_float(src[kk * outer + i])));
    }
  }
  partial[y][x] = bits;
  __syncthreads();
  if (y == 0) {
    for (int r = 1; r < kLines; ++r) bits = max32(bits, partial[r][x]);
    if (active) {
      row_scale[x] = scale_for<Code>(bits_to_float(bits), mx, power_of_two, scales,
                                     scale_index(mode, outer, k, i, b));
      if (amax != nullptr) atomicMax(amax, bits);
    }
  }
  __syncthreads();

  // Each 32 x 32 piece: thread (x, y) quantises src row kb + y, column i0 + x into tile[y][x],
  // then writes tile[x][y] to code row i0 + y, position kb + x.
  const float s = active ? row_scale[x] : 1.0f;
  const int64_t writer_row = i0 + y;
  for (int64_t kb = k0; kb < k1; kb += kLines) {
    const int64_t kk = kb + y;
    if (active && kk < k1) tile[y][x] = quantize_with_scale<Code>(to_float(src[kk * outer + i]), s);
    __syncthreads();
    if (writer_row < outer && kb + x < k1) codes[writer_row * k + kb + x] = tile[x][y];
    __syncthreads();
  }
}

__global__ void fill_f32_kernel(float* __restrict__ x, int64_t n, float value) {
  for (int64_t i = cuda_kernels::global_thread_index(); i < n; i += cuda_kernels::grid_stride()) {
    x[i] = value;
  }
}

}  // namespace

void CudaBackend::quantize_blocks(const Tensor& src, Tensor& codes, Tensor& scales,
                                  const BlockQuantizeParams& p) {
  const QuantizeDims d = check_quantize_blocks(src, codes, scales, p, device());
  const ScaleMode mode = p.mode;
  constexpr int kThreads = 256;
  // Padding first (the scale of an all-zero block); the blocks then overwrite their entries.
  if (mode == ScaleMode::kVec32Ue8m0) {
    MANTISSA_CUDA_CHECK(
        cudaMemsetAsync(scales.data(), 127, static_cast<size_t>(scales.numel()), stream()));
  } else if (scales.numel() > 0) {
    fill_f32_kernel<<<cuda_kernels::grid_size(scales.numel(), kThreads, multiprocessor_count_),
                      kThreads, 0, stream()>>>(scales.data_as<float>(), scales.numel(), 1.0f);
    MANTISSA_CUDA_CHECK_LAUNCH();
  }
  // The amax is accumulated as magnitude bits (an F32 +0 is the bits 0), from 0 or from the
  // amax it holds.
  auto* amax = p.amax != nullptr ? static_cast<uint32_t*>(p.amax->data()) : nullptr;
  if (amax != nullptr && !p.accumulate_amax) {
    MANTISSA_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(uint32_t), stream()));
  }
  if (d.outer == 0 || d.k == 0) return;

  cuda_kernels::dispatch_f32_bf16_f16(kOp, src.dtype(), [&](auto src_tag) {
    using Src = decltype(src_tag);
    const auto launch = [&](auto code_tag) {
      using Code = decltype(code_tag);
      const Src* in = src.data_as<const Src>();
      Code* out = codes.data_as<Code>();
      const auto warp_grid = [&](int64_t warps) {
        return cuda_kernels::grid_size(warps * cuda_kernels::kWarpSize, kThreads,
                                       multiprocessor_count_);
      };
      if (mode == ScaleMode::kBlock128) {
        const dim3 grid(static_cast<unsigned>(ceil_div(d.outer, kTile)),
                        static_cast<unsigned>(ceil_div(d.k, kTile)));
        MANTISSA_CHECK(grid.y <= 65535u, kOp << ": src " << src.describe() << " has " << grid.y
                                             << " 128-element blocks along K, more "
                                                "than one launch takes (65535)");
        quantize_square_kernel<Src, Code><<<grid, kTile, 0, stream()>>>(
            in, out, scales.data_as<float>(), amax, d.outer, d.k, p.transpose, p.power_of_two);
      } else if (p.transpose) {
        const int64_t row_blocks = ceil_div(d.outer, kLines);
        MANTISSA_CHECK(row_blocks <= 65535, kOp << ": src " << src.describe() << " has " << d.outer
                                                << " columns, more than one launch takes ("
                                                << 65535 * kLines << ")");
        const dim3 grid(static_cast<unsigned>(scale_k_blocks(mode, d.k)),
                        static_cast<unsigned>(row_blocks));
        quantize_transposed_kernel<Src, Code><<<grid, dim3(kLines, kLines), 0, stream()>>>(
            in, out, scales.data(), amax, d.outer, d.k, mode, p.power_of_two);
      } else if (mode == ScaleMode::kOuterVec) {
        quantize_whole_rows_kernel<Src, Code><<<warp_grid(d.outer), kThreads, 0, stream()>>>(
            in, out, scales.data_as<float>(), amax, d.outer, d.k, p.power_of_two);
      } else {
        const int64_t chunks = d.outer * ceil_div(d.k, kChunk);
        if (mode == ScaleMode::kVec32Ue8m0) {
          quantize_chunks_kernel<Src, Code, true><<<warp_grid(chunks), kThreads, 0, stream()>>>(
              in, out, scales.data(), amax, d.outer, d.k, p.power_of_two);
        } else {
          quantize_chunks_kernel<Src, Code, false><<<warp_grid(chunks), kThreads, 0, stream()>>>(
              in, out, scales.data(), amax, d.outer, d.k, p.power_of_two);
        }
      }
      MANTISSA_CUDA_CHECK_LAUNCH();
    };
    if (codes.dtype() == DType::kE4M3) {
      launch(fp8_e4m3{});
    } else {
      launch(fp8_e5m2{});
    }
  });
}

}  // namespace mantissa::core
