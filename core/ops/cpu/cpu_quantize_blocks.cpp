// CpuBackend::quantize_blocks: block quantisation by the rules of
// core/precision/block_scaling.h, bit-identical to the CUDA kernels (the same scalar
// functions decide every scale, and every code equals quantize_with_scale's).
//
// The work is cut into tiles of whole blocks spread over the OpenMP threads, and each block is
// read twice while it sits in L1 or L2: once for its amax, an integer maximum of the magnitude
// bits (which order like the magnitudes, with inf and NaN above every number, so a non-finite
// block is seen), then for its codes, which the fused kernels of cpu_quantize_runs.h compute
// in registers from the source (widen, divide, round, store bytes).
//  - Untransposed, the operand's rows are src's rows: a tile is up to 128 rows (exactly 128
//    for 128x128 blocks), and each block is a contiguous run of a row. A row's blocks take
//    their amaxes, then their scales (eight at a time), then their codes in one call, which
//    asks the next row into L1 meanwhile (the codes pass reads L1 only, so the hardware
//    prefetchers, which follow L2 misses, would not); a tile of 128x128 blocks goes through
//    the same calls in two passes, all its amaxes first.
//  - Transposed, the operand's rows are src's columns: a tile is 64 adjacent columns (128 for
//    128x128 blocks), read kColumns at a time as vector lanes along src's contiguous rows;
//    the codes of a K-block come out as [K, kColumns] bytes and are transposed in 16x16
//    blocks into the operand's rows. Columns past the last whole group of kColumns take the
//    scalar definitions. Here each source row read is a short piece on its own page and each
//    operand row written a short piece of a line, which the hardware prefetchers do not
//    follow, so the next K-block's source and destination lines are asked for while this one
//    is quantised (1.7-1.9x on a 2-core Xeon, the wgrad input's 1x128 tiles along tokens).
// Results do not depend on the tiling or thread count: every block lies in one tile, and
// every code is a function of its element and its block's scale alone.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "core/int_math.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_quantize_runs.h"
#include "core/ops/cpu/scratch_buffer.h"
#include "core/ops/quantize_checks.h"
#include "core/precision/fp8_scale.h"

namespace mantissa::core {
namespace {

using quantize_runs::Divisor;
using quantize_runs::kColumns;

constexpr int64_t kTileElements = 1 << 14;
// Below this many elements one thread does everything.
constexpr int64_t kParallelElements = 1 << 15;
constexpr int64_t kTransposedTileColumns = 2 * kColumns;
// Scales computed per batch (block_scales' buffers).
constexpr int64_t kMaxBlocks = 128;

// What the blocks of one call share, and the scale of each.
struct Blocks {
  ScaleMode mode;
  bool power_of_two;
  float fmt_max;
  DType code;
  int64_t outer, k, block_k, k_blocks;
  void* scales;

  bool square() const { return mode == ScaleMode::kBlock128; }

  ScaleRowIndex row_index(int64_t i) const { return scale_row_index(mode, outer, k, i); }

  // Stores the scale of the block of operand row i, K-block b, whose amax pattern is `bits`,
  // and returns its divisor (one block: 128x128).
  Divisor scale(uint32_t bits, int64_t i, int64_t b) const {
    Divisor d;
    scales_of(
        &bits, 1, [&](int64_t) { return row_index(i)(b); }, &d);
    return d;
  }

  // The scales of n blocks whose amax patterns are amax[j], stored at index(j), and their
  // divisors in d[j].
  template <class Index>
  void scales_of(const uint32_t* amax, int64_t n, const Index& index, Divisor* d) const {
    float s[kMaxBlocks];
    uint8_t e8m0[kMaxBlocks];
    const bool mx = mode == ScaleMode::kVec32Ue8m0;
    for (int64_t j0 = 0; j0 < n; j0 += kMaxBlocks) {
      const int64_t m = std::min(kMaxBlocks, n - j0);
      quantize_runs::block_scales(amax + j0, m, fmt_max, power_of_two, mx, s, e8m0, d + j0);
      for (int64_t j = 0; j < m; ++j) {
        if (mx) {
          static_cast<uint8_t*>(scales)[index(j0 + j)] = e8m0[j];
        } else {
          static_cast<float*>(scales)[index(j0 + j)] = s[j];
        }
      }
    }
  }
};

template <class Src>
uint32_t scalar_amax_bits(const Src* x, int64_t stride, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i)
    m = std::max(m, float_to_bits(to_float(x[i * stride])) & 0x7FFFFFFFu);
  return m;
}

uint8_t scalar_code(DType code, float x, float s) {
  return code == DType::kE4M3 ? quantize_with_scale<fp8_e4m3>(x, s).bits
                              : quantize_with_scale<fp8_e5m2>(x, s).bits;
}

// Operand rows [i0, i0 + rows) of an untransposed src; returns their amax pattern.
template <class Src>
uint32_t quantize_rows(const Src* src, const Blocks& q, int64_t i0, int64_t rows, uint8_t* codes) {
  uint32_t amax = 0;
  thread_local ScratchBuffer<uint32_t> amax_store;
  thread_local ScratchBuffer<Divisor> divisor_store;
  uint32_t* block_amax = amax_store.get(2 * q.k_blocks);
  uint32_t* row_amax = block_amax + q.k_blocks;
  Divisor* divisor = divisor_store.get(q.k_blocks);
  if (q.square()) {
    // 128x128 blocks: the tile's rows in two passes (it stays in L2), the first taking every
    // block's amax row by row, the second the codes of whole rows.
    std::fill_n(block_amax, q.k_blocks, 0u);
    for (int64_t r = 0; r < rows; ++r) {
      quantize_runs::block_amax(src + (i0 + r) * q.k, q.k, q.block_k, row_amax);
      for (int64_t b = 0; b < q.k_blocks; ++b) block_amax[b] = std::max(block_amax[b], row_amax[b]);
    }
    amax = *std::max_element(block_amax, block_amax + q.k_blocks);
    q.scales_of(block_amax, q.k_blocks, q.row_index(i0), divisor);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at = (i0 + r) * q.k;
      quantize_runs::quantize_row(src + at, q.k, q.block_k, divisor, q.code, codes + at, nullptr);
    }
    return amax;
  }
  // One row at a time: its blocks' amaxes, then their scales together, then its codes.
  for (int64_t r = 0; r < rows; ++r) {
    const Src* row = src + (i0 + r) * q.k;
    uint8_t* row_codes = codes + (i0 + r) * q.k;
    quantize_runs::block_amax(row, q.k, q.block_k, block_amax);
    amax = std::max(amax, *std::max_element(block_amax, block_amax + q.k_blocks));
    const int64_t i = i0 + r;
    q.scales_of(block_amax, q.k_blocks, q.row_index(i), divisor);
    quantize_runs::quantize_row(row, q.k, q.block_k, divisor, q.code, row_codes,
                                i + 1 < q.outer ? row + q.k : nullptr);
  }
  return amax;
}

// The codes of kColumns operand rows (src columns) for K-block rows [k0, k0 + width), as
// [width, kColumns] bytes in `buffer`, moved into the operand's rows through `tile` (as large). The
// operand's rows lie k bytes apart, often a multiple of 4 KiB that maps them all to a few L1 sets;
// writing each row's 16-byte pieces there directly would evict and refetch its lines several times,
// so the 16x16 transposes fill a contiguous [kColumns, width] tile and each row leaves it whole.
// The next `next_width` bytes of each row, which the next K-block writes, are asked into L2
// meanwhile, so that its stores do not wait for their lines.
void store_transposed(const uint8_t* buffer, int64_t width, uint8_t* tile, uint8_t* codes,
                      int64_t k, int64_t next_width) {
  int64_t r = 0;
  for (; r + 16 <= width; r += 16) {
    for (int64_t h = 0; h < kColumns; h += 16) {
      quantize_runs::transpose16x16(buffer + r * kColumns + h, kColumns, tile + h * width + r,
                                    width);
    }
  }
  for (; r < width; ++r) {
    for (int64_t c = 0; c < kColumns; ++c) tile[c * width + r] = buffer[r * kColumns + c];
  }
  for (int64_t c = 0; c < kColumns; ++c) {
    std::memcpy(codes + c * k, tile + c * width, width);
    quantize_runs::prefetch_l2(codes + c * k + width, next_width);
  }
}

// Operand rows [i0, i0 + cols) of a transposed src ([K, outer]: operand row i is column i);
// returns their amax pattern.
template <class Src>
uint32_t quantize_columns(const Src* src, const Blocks& q, int64_t i0, int64_t cols,
                          uint8_t* codes) {
  thread_local ScratchBuffer<uint8_t> buffer_store;
  uint8_t* buffer = buffer_store.get(2 * q.block_k * kColumns);
  uint8_t* tile = buffer + q.block_k * kColumns;
  uint32_t lane_amax[128];
  Divisor divisor[128];
  const int64_t vector_cols = cols / kColumns * kColumns;
  uint32_t amax = 0;
  for (int64_t b = 0; b < q.k_blocks; ++b) {
    const int64_t k0 = b * q.block_k, width = std::min(q.block_k, q.k - k0);
    const Src* block = src + k0 * q.outer + i0;
    // The next K-block, prefetched while this one is quantised when it is as wide.
    const int64_t next_width = std::min(q.block_k, q.k - k0 - width);
    const Src* next = next_width == width ? block + width * q.outer : nullptr;
    for (int64_t c = 0; c < vector_cols; c += kColumns) {
      quantize_runs::amax_columns(block + c, q.outer, width, lane_amax + c);
    }
    for (int64_t c = vector_cols; c < cols; ++c) {
      lane_amax[c] = scalar_amax_bits(block + c, q.outer, width);
    }
    if (q.square()) {
      const uint32_t bits = *std::max_element(lane_amax, lane_amax + cols);
      amax = std::max(amax, bits);
      std::fill_n(divisor, cols, q.scale(bits, i0, b));
    } else {
      amax = std::max(amax, *std::max_element(lane_amax, lane_amax + cols));
      q.scales_of(
          lane_amax, cols, [&](int64_t c) { return q.row_index(i0 + c)(b); }, divisor);
    }
    for (int64_t c = 0; c < vector_cols; c += kColumns) {
      const bool any_infinite = std::any_of(lane_amax + c, lane_amax + c + kColumns,
                                            [](uint32_t bits) { return bits >= kF32InfBits; });
      quantize_runs::quantize_columns(block + c, q.outer, width, divisor + c, any_infinite, q.code,
                                      buffer, next == nullptr ? nullptr : next + c);
      store_transposed(buffer, width, tile, codes + (i0 + c) * q.k + k0, q.k, next_width);
    }
    for (int64_t c = vector_cols; c < cols; ++c) {
      for (int64_t kk = 0; kk < width; ++kk) {
        codes[(i0 + c) * q.k + k0 + kk] =
            scalar_code(q.code, to_float(block[kk * q.outer + c]), divisor[c].s);
      }
    }
  }
  return amax;
}

template <class Src>
uint32_t quantize_all(const Src* src, const Blocks& q, bool transpose, uint8_t* codes) {
  const int64_t tile = transpose
                           ? (q.square() ? 128 : kTransposedTileColumns)
                           : (q.square() ? 128 : std::clamp<int64_t>(kTileElements / q.k, 1, 128));
  const int64_t tiles = ceil_div(q.outer, tile);
  uint32_t amax = 0;
#pragma omp parallel for schedule(static) \
    reduction(max                         \
              : amax) if (q.outer * q.k >= kParallelElements && tiles > 1)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t i0 = t * tile, n = std::min(tile, q.outer - i0);
    amax = std::max(amax, transpose ? quantize_columns(src, q, i0, n, codes)
                                    : quantize_rows(src, q, i0, n, codes));
  }
  return amax;
}

}  // namespace

void CpuBackend::quantize_blocks(const Tensor& src, Tensor& codes, Tensor& scales,
                                 const BlockQuantizeParams& p) {
  const QuantizeDims d = check_quantize_blocks(src, codes, scales, p, device());
  const bool mx = p.mode == ScaleMode::kVec32Ue8m0;
  // Padding first (the scale of an all-zero block); the blocks then overwrite their entries.
  if (mx) {
    std::memset(scales.data(), 127, static_cast<size_t>(scales.numel()));
  } else {
    std::fill_n(scales.data_as<float>(), scales.numel(), 1.0f);
  }
  if (d.outer == 0 || d.k == 0) {
    if (p.amax != nullptr && !p.accumulate_amax) *p.amax->data_as<float>() = 0.0f;
    return;
  }

  const Blocks q{
      p.mode,
      p.power_of_two || mx,
      codes.dtype() == DType::kE4M3 ? fp8_format_max<fp8_e4m3>() : fp8_format_max<fp8_e5m2>(),
      codes.dtype(),
      d.outer,
      d.k,
      scale_block_k(p.mode, d.k),
      scale_k_blocks(p.mode, d.k),
      scales.data()};
  auto* code_bytes = static_cast<uint8_t*>(codes.data());
  uint32_t amax_bits;
  switch (src.dtype()) {
    case DType::kF32:
      amax_bits = quantize_all(src.data_as<const float>(), q, p.transpose, code_bytes);
      break;
    case DType::kBF16:
      amax_bits = quantize_all(src.data_as<const bf16>(), q, p.transpose, code_bytes);
      break;
    default: amax_bits = quantize_all(src.data_as<const fp16>(), q, p.transpose, code_bytes);
  }

  if (p.amax != nullptr) {
    // A NaN anywhere reads back as the canonical NaN, as the CUDA kernel writes it.
    const float amax = amax_from_abs_bits(amax_bits);
    float& out = *p.amax->data_as<float>();
    out = p.accumulate_amax ? larger_amax(out, amax) : amax;
  }
}

}  // namespace mantissa::core
