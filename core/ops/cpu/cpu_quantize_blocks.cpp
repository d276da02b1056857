// CpuBackend::quantize_blocks: block quantisation by the rules of
// core/precision/block_scaling.h, bit-identical to the CUDA kernels (the same scalar
// functions decide every scale and code).
//
// The work is cut into tiles of whole operand rows (128 rows for 128x128 blocks, so a tile
// holds whole blocks; else enough rows for about 16K elements), spread over the OpenMP
// threads. A tile is widened to FP32 in the operand's layout (with `transpose` the operand's
// rows are src's columns: each src row gives a contiguous run of the tile's rows, scattered
// into it), each block's amax is an integer maximum of the magnitude bits (which order like
// the magnitudes, with inf and NaN above every number, so a non-finite block is seen), every
// element is divided by its block's scale, and the whole tile is rounded at once by the bulk
// narrow_from_f32 (the vectorised dtype.h rounding), its codes being contiguous rows of the
// output.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_convert.h"
#include "core/ops/cpu/scratch_buffer.h"
#include "core/ops/quantize_checks.h"

namespace mantissa::core {
namespace {

constexpr int64_t kTileElements = 1 << 14;
// Below this many elements one thread does everything.
constexpr int64_t kParallelElements = 1 << 15;

uint32_t max_magnitude_bits(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = float_to_bits(x[i]) & 0x7FFFFFFFu;
    m = bits > m ? bits : m;
  }
  return m;
}

// tile[r * k + kk] = element (i0 + r, kk) of the operand, for r < rows and every kk.
template <class Src>
void load_rows(const Src* src, bool transpose, int64_t outer, int64_t k, int64_t i0, int64_t rows,
               float* tile) {
  if (!transpose) {
    const Src* from = src + i0 * k;
    for (int64_t e = 0; e < rows * k; ++e) tile[e] = to_float(from[e]);
    return;
  }
  // src is [K, outer]: its row kk holds operand rows i0 .. i0 + rows side by side.
  for (int64_t kk = 0; kk < k; ++kk) {
    const Src* from = src + kk * outer + i0;
    for (int64_t r = 0; r < rows; ++r) tile[r * k + kk] = to_float(from[r]);
  }
}

void load_tile(const Tensor& src, bool transpose, int64_t outer, int64_t k, int64_t i0,
               int64_t rows, float* tile) {
  switch (src.dtype()) {
    case DType::kF32:
      return load_rows(src.data_as<const float>(), transpose, outer, k, i0, rows, tile);
    case DType::kBF16:
      return load_rows(src.data_as<const bf16>(), transpose, outer, k, i0, rows, tile);
    default: return load_rows(src.data_as<const fp16>(), transpose, outer, k, i0, rows, tile);
  }
}

void divide(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] = divide_rn(x[i], s);
}

}  // namespace

void CpuBackend::quantize_blocks(const Tensor& src, Tensor& codes, Tensor& scales,
                                 const BlockQuantizeParams& p) {
  const QuantizeDims d = check_quantize_blocks(src, codes, scales, p, device());
  const ScaleMode mode = p.mode;
  const bool mx = mode == ScaleMode::kVec32Ue8m0;
  const bool power_of_two = p.power_of_two || mx;
  const float fmt_max =
      codes.dtype() == DType::kE4M3 ? fp8_format_max<fp8_e4m3>() : fp8_format_max<fp8_e5m2>();
  // Padding first (the scale of an all-zero block); the blocks then overwrite their entries.
  if (mx) {
    std::memset(scales.data(), 127, static_cast<size_t>(scales.numel()));
  } else {
    std::fill_n(scales.data_as<float>(), scales.numel(), 1.0f);
  }
  if (d.outer == 0 || d.k == 0) {
    if (p.amax != nullptr) *p.amax->data_as<float>() = 0.0f;
    return;
  }

  const bool square_blocks = mode == ScaleMode::kBlock128;
  const int64_t tile_rows = square_blocks ? 128 : std::clamp<int64_t>(kTileElements / d.k, 1, 128);
  const int64_t block_k = scale_block_k(mode, d.k);
  const int64_t k_blocks = scale_k_blocks(mode, d.k);
  const int64_t tiles = (d.outer + tile_rows - 1) / tile_rows;
  auto* code_bytes = static_cast<unsigned char*>(codes.data());
  uint32_t amax_bits = 0;

#pragma omp parallel for schedule(static) \
    reduction(max                         \
              : amax_bits) if (d.outer * d.k >= kParallelElements && tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    thread_local ScratchBuffer<float> tile_buffer;
    const int64_t i0 = t * tile_rows;
    const int64_t rows = std::min(tile_rows, d.outer - i0);
    float* tile = tile_buffer.get(rows * d.k);
    load_tile(src, p.transpose, d.outer, d.k, i0, rows, tile);

    for (int64_t b = 0; b < k_blocks; ++b) {
      const int64_t k0 = b * block_k;
      const int64_t width = std::min(block_k, d.k - k0);
      if (square_blocks) {
        uint32_t bits = 0;
        for (int64_t r = 0; r < rows; ++r) {
          bits = std::max(bits, max_magnitude_bits(tile + r * d.k + k0, width));
        }
        amax_bits = std::max(amax_bits, bits);
        const float s = block_scale(bits_to_float(bits), fmt_max, power_of_two);
        scales.data_as<float>()[scale_index(mode, d.outer, d.k, i0, b)] = s;
        for (int64_t r = 0; r < rows; ++r) divide(tile + r * d.k + k0, width, s);
        continue;
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* block = tile + r * d.k + k0;
        const uint32_t bits = max_magnitude_bits(block, width);
        amax_bits = std::max(amax_bits, bits);
        const float amax = bits_to_float(bits);
        const int64_t index = scale_index(mode, d.outer, d.k, i0 + r, b);
        float s;
        if (mx) {
          const uint8_t e = mx_scale_e8m0(amax, fmt_max);
          static_cast<uint8_t*>(scales.data())[index] = e;
          s = e8m0_to_float(e);
        } else {
          s = block_scale(amax, fmt_max, power_of_two);
          scales.data_as<float>()[index] = s;
        }
        divide(block, width, s);
      }
    }
    NarrowOptions narrow;
    narrow.saturation = Saturation::kSatFinite;
    narrow_from_f32(tile, code_bytes + i0 * d.k, codes.dtype(), rows * d.k, narrow);
  }

  if (p.amax != nullptr) {
    // A NaN anywhere reads back as the canonical NaN, as the CUDA kernel writes it.
    *p.amax->data_as<float>() = bits_to_float(amax_bits > 0x7F800000u ? 0x7FC00000u : amax_bits);
  }
}

}  // namespace mantissa::core
