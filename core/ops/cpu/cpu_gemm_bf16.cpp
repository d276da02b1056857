// BF16 GEMM with VDPBF16PS, for CPUs with AVX512-BF16, and on AMX tiles where the CPU has them.
//
// VDPBF16PS does 32 multiply-adds per instruction, but CPUs issue it at different rates: on a
// Sapphire Rapids it runs at half the FP32 FMA rate, so the kernel reaches only 0.68x OpenBLAS
// sgemm there, while one AMX TDPBF16PS does 8,192 multiply-adds (cpu_gemm_amx.h). So GEMMs run
// on AMX tiles where amx::enabled() (5.2-5.3x sgemm on that CPU, 1 thread, bench_cpu_gemm's
// geometric means): strips of 32 rows packed in steps of 16 K pairs (amx::strip_offset), the same
// panels, K padded with zero pairs; block-scaled ones sum each K-block on the tiles and fold it as
// below. The rest of this comment is about the VDPBF16PS kernel.
//
// VDPBF16PS takes two vectors of 32 BF16 values, multiplies them lane by lane and adds each
// pair of neighbouring products to one FP32 lane of the accumulator: 32 multiply-adds per
// instruction, twice the 16 of an FP32 FMA. A product of two BF16 values (8-bit significands)
// is exact in FP32, and the sums round to nearest even, so the result is an FP32 sum of exact
// products like cuBLASLt's CUBLAS_COMPUTE_32F. Each lane adds the pair's k + 1 product and
// then its k product, each addition rounded (the instruction's definition, which Intel's and
// AMD's CPUs follow), so an element of C is the FP32 sum over k = 1, 0, 3, 2, 5, 4, ... in
// that order, from +0. The instruction reads BF16 subnormals
// (|x| < 2^-126) as zero and flushes subnormal sums to zero; nothing a model trains on lives
// there, and every FP8 value is a normal BF16 value.
//
// The layout is the classic one of BLIS and OpenBLAS:
//  - op(A) is packed into strips of kRows rows, op(B) into panels of kCols columns, each with
//    the two values of a k pair side by side (the pairs VDPBF16PS sums) and zeros past the
//    edges, converting FP8 codes to BF16 on the way.
//  - A micro-tile is kRows x kCols of C: 24 accumulator vectors, two of B per k pair, and
//    each A pair broadcast to all lanes. It runs over all of K before touching C, so alpha
//    and beta are applied once to the complete sum.
//  - Panels are visited in blocks of about kBlockBytes, so one block stays in L2 while a
//    thread's strips pass over it.
//  - With block scales (cpu_gemm_block_scales.h) a micro-tile sums one K-block at a time into
//    the same 24 accumulators and folds each block's sums into an FP32 tile in L1; the
//    operands are packed once, as without scales.
// Packing and the micro-tiles are spread over the OpenMP threads; the packed operands live in
// buffers that grow to the largest call and stay.
#include "core/ops/cpu/cpu_gemm_bf16.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/int_math.h"
#include "core/ops/cpu/cpu_gemm_amx.h"
#include "core/ops/cpu/cpu_switch.h"
#include "core/ops/cpu/scratch_buffer.h"

// Functions that use AVX-512 carry this attribute: the rest of the library is built for
// AVX2, and they only run after bf16_gemm_enabled() has seen the instructions.
#define MANTISSA_AVX512_BF16 gnu::target("avx512f,avx512bw,avx512vl,avx512bf16")

namespace mantissa::core {
namespace {

constexpr int64_t kRows = 12;  // rows of C per micro-tile: 24 accumulators of 32 registers
constexpr int64_t kCols = 32;  // columns of C per micro-tile: two vectors of 16 FP32
constexpr int64_t kBlockBytes = 256 << 10;  // packed B per block of panels, well inside L2

// The BF16 patterns of the 256 codes of an FP8 type (each exact).
template <class T>
const std::array<uint16_t, 256>& fp8_to_bf16_table() {
  static const std::array<uint16_t, 256> table = [] {
    std::array<uint16_t, 256> t{};
    for (int code = 0; code < 256; ++code) {
      t[code] = bf16_from_float(to_float(T{static_cast<uint8_t>(code)})).bits;
    }
    return t;
  }();
  return table;
}

// A function object giving the BF16 pattern of a stored value: BF16 as it is, FP8 through
// its table (looked up once here, not per element).
template <class T>
auto bf16_decoder() {
  if constexpr (std::is_same_v<T, bf16>) {
    return [](bf16 x) { return x.bits; };
  } else {
    const uint16_t* table = fp8_to_bf16_table<T>().data();
    return [table](T x) { return table[x.bits]; };
  }
}

// Packs `lines` rows of op(A) for a VDPBF16PS strip of `width` lines (the panels have their
// own AVX-512 packers below): dword (p, l) = (value (l, 2p), value (l, 2p + 1)) goes to out[p width
// + l], zero past `lines` and past an odd K. src points at value (0, 0); value (l, k) is src[k ld +
// l] when k_major, else src[l ld + k]. Stores run along l, contiguously; when k_major, so do the
// loads (two source rows interleaved), which the compiler vectorizes.
template <class T>
void pack_pairs(const T* src, bool k_major, int64_t ld, int64_t lines, int64_t k, int64_t width,
                uint32_t* out) {
  const auto decode = bf16_decoder<T>();
  const int64_t pairs = (k + 1) / 2;
  const auto value = [&](int64_t l, int64_t kk) -> uint32_t {
    return kk < k ? decode(src[k_major ? kk * ld + l : l * ld + kk]) : 0u;
  };
  for (int64_t p = 0; p < pairs; ++p) {
    uint32_t* dst = out + p * width;
    if (k_major && 2 * p + 1 < k) {
      const T* lo = src + 2 * p * ld;
      const T* hi = lo + ld;
      for (int64_t l = 0; l < lines; ++l) dst[l] = decode(lo[l]) | uint32_t{decode(hi[l])} << 16;
    } else if (!k_major && 2 * p + 1 < k) {
      for (int64_t l = 0; l < lines; ++l) {
        dst[l] = decode(src[l * ld + 2 * p]) | uint32_t{decode(src[l * ld + 2 * p + 1])} << 16;
      }
    } else {
      for (int64_t l = 0; l < lines; ++l) dst[l] = value(l, 2 * p) | value(l, 2 * p + 1) << 16;
    }
    std::fill(dst + lines, dst + width, 0u);
  }
}

// GCC 12's AVX-512 intrinsics pass a deliberately self-initialised "undefined" vector as the
// pass-through operand of unmasked conversions and shifts, which -Wmaybe-uninitialized
// reports once they are inlined; nothing here reads it.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// Sixteen values of C (the lanes in `valid`) as FP32, and back: an FP32 C as it is, a BF16 C
// widened, and rounded to nearest even as bf16_from_float rounds (NaN becomes 0x7FFF), so that
// a BF16 C is what rounding the FP32 result afterwards would give.
[[MANTISSA_AVX512_BF16]] __m512 load16(const float* p, __mmask16 valid) {
  return _mm512_maskz_loadu_ps(valid, p);
}
[[MANTISSA_AVX512_BF16]] __m512 load16(const bf16* p, __mmask16 valid) {
  const __m256i codes = _mm256_maskz_loadu_epi16(valid, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(codes), 16));
}
[[MANTISSA_AVX512_BF16]] void store16(float* p, __mmask16 valid, __m512 v) {
  _mm512_mask_storeu_ps(p, valid, v);
}
[[MANTISSA_AVX512_BF16]] void store16(bf16* p, __mmask16 valid, __m512 v) {
  const __m512i bits = _mm512_castps_si512(v);
  const __m512i lowest_kept = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i codes = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(_mm512_set1_epi32(0x7FFF), lowest_kept)), 16);
  const __mmask16 nan = _mm512_cmpgt_epu32_mask(
      _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)), _mm512_set1_epi32(0x7F800000));
  codes = _mm512_mask_mov_epi32(codes, nan, _mm512_set1_epi32(0x7FFF));
  _mm256_mask_storeu_epi16(p, valid, _mm512_cvtepi32_epi16(codes));
}

// Transposes 16 x 16 dwords in place: lane l of r[i] becomes lane i of r[l]. Pairs of rows
// interleave their dwords, then their qwords, then 128-bit lanes are gathered in two rounds.
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline void transpose16x16(__m512i (&r)[16]) {
  __m512i t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
    r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
    r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
    r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
  }
  for (int i = 0; i < 4; ++i) {
    t[i] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0x88);
    t[i + 4] = _mm512_shuffle_i32x4(r[i], r[i + 4], 0xdd);
    t[i + 8] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0x88);
    t[i + 12] = _mm512_shuffle_i32x4(r[i + 8], r[i + 12], 0xdd);
  }
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
  }
}

// The BF16 patterns of the 256 codes of an FP8 type in eight registers, for bf16_words; empty
// for BF16 operands.
struct Fp8Table {
  __m512i quarter[8];
};
template <class T>
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline Fp8Table load_fp8_table() {
  Fp8Table t{};
  if constexpr (!std::is_same_v<T, bf16>) {
    const uint16_t* codes = fp8_to_bf16_table<T>().data();
    for (int i = 0; i < 8; ++i) t.quarter[i] = _mm512_loadu_si512(codes + 32 * i);
  }
  return t;
}

// The BF16 patterns of 32 consecutive values from src as 32 words, zero in the lanes not in
// `valid` (which are not read): BF16 as they are; FP8 codes looked up in the table, where
// permutex2var picks within each quarter of 64 codes and bits 6 and 7 of the code pick the
// quarter.
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline __m512i bf16_words(const bf16* src,
                                                                       __mmask32 valid,
                                                                       const Fp8Table&) {
  return _mm512_maskz_loadu_epi16(valid, src);
}
template <class T>
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline __m512i bf16_words(const T* src,
                                                                       __mmask32 valid,
                                                                       const Fp8Table& t) {
  const __m512i code = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(valid, src));
  const __m512i q0 = _mm512_permutex2var_epi16(t.quarter[0], code, t.quarter[1]);
  const __m512i q1 = _mm512_permutex2var_epi16(t.quarter[2], code, t.quarter[3]);
  const __m512i q2 = _mm512_permutex2var_epi16(t.quarter[4], code, t.quarter[5]);
  const __m512i q3 = _mm512_permutex2var_epi16(t.quarter[6], code, t.quarter[7]);
  const __mmask32 bit6 = _mm512_test_epi16_mask(code, _mm512_set1_epi16(0x40));
  const __mmask32 bit7 = _mm512_test_epi16_mask(code, _mm512_set1_epi16(0x80));
  const __m512i low = _mm512_mask_blend_epi16(bit6, q0, q1);
  const __m512i high = _mm512_mask_blend_epi16(bit6, q2, q3);
  return _mm512_maskz_mov_epi16(valid, _mm512_mask_blend_epi16(bit7, low, high));
}

// Lane l = (lo[l], hi[l]) as a BF16 pair, for l < 16 in `valid` (zero elsewhere): two lines
// stored along l, side by side.
template <class T>
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline __m512i pair_lanes(const T* lo, const T* hi,
                                                                       __mmask16 valid,
                                                                       const Fp8Table& t) {
  const __m512i low = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(bf16_words(lo, valid, t)));
  const __m512i high = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(bf16_words(hi, valid, t)));
  return _mm512_or_si512(low, _mm512_slli_epi32(high, 16));
}

// Packs `lines` rows of A (not transposed) for an AMX strip: dword (l, p) = (A(l, 2p),
// A(l, 2p + 1)) goes to out[amx::strip_offset(l, p)], zero past `lines` (up to amx::kTileRows)
// and past K; row l of A starts at src[l ld]. A step of a row is 32 consecutive values, which
// are its 16 pairs in order.
template <class T>
[[MANTISSA_AVX512_BF16]] void pack_rows(const T* src, int64_t ld, int64_t lines, int64_t k,
                                        int64_t padded_pairs, uint32_t* out) {
  constexpr int64_t kStep = amx::kPairsPerStep;
  const auto decode = bf16_decoder<T>();
  const Fp8Table table = load_fp8_table<T>();
  for (int64_t l = 0; l < amx::kTileRows; ++l) {
    const T* row = l < lines ? src + l * ld : nullptr;
    const auto value = [&](int64_t kk) -> uint32_t { return row && kk < k ? decode(row[kk]) : 0u; };
    for (int64_t p = 0; p < padded_pairs; p += kStep) {
      uint32_t* dst = out + amx::strip_offset(l, p);
      if (row != nullptr && 2 * (p + kStep) <= k) {
        _mm512_storeu_si512(dst, bf16_words(row + 2 * p, ~__mmask32{0}, table));
      } else {  // past the rows, or K's last step
        for (int64_t q = 0; q < kStep; ++q)
          dst[q] = value(2 * (p + q)) | value(2 * (p + q) + 1) << 16;
      }
    }
  }
}

// pack_rows for a transposed A [k, m] (the dW GEMMs), whose strip rows are columns: value
// (l, kk) is src[kk ld + l]. Read row by row, a column costs a cache line per value, so
// blocks of 16 pairs x 16 columns are read as 32 contiguous runs of source rows, transposed
// in registers and stored as one contiguous run of the strip; the pairs past the last whole
// block go one by one.
template <class T>
[[MANTISSA_AVX512_BF16]] void pack_rows_transposed(const T* src, int64_t ld, int64_t lines,
                                                   int64_t k, int64_t padded_pairs, uint32_t* out) {
  const auto decode = bf16_decoder<T>();
  const Fp8Table table = load_fp8_table<T>();
  const int64_t blocked = k / 2 / 16 * 16;  // pairs in whole blocks of 16
  for (int64_t p0 = 0; p0 < blocked; p0 += 16) {
    for (int64_t l0 = 0; l0 < amx::kTileRows; l0 += 16) {
      const int64_t valid = std::clamp<int64_t>(lines - l0, 0, 16);
      __m512i r[16];
      for (int64_t i = 0; i < 16; ++i) {
        const T* lo = src + 2 * (p0 + i) * ld + l0;
        r[i] = valid == 0
                   ? _mm512_setzero_si512()
                   : pair_lanes(lo, lo + ld, static_cast<__mmask16>((1u << valid) - 1), table);
      }
      transpose16x16(r);
      for (int64_t l = 0; l < 16; ++l)
        _mm512_storeu_si512(out + amx::strip_offset(l0 + l, p0), r[l]);
    }
  }
  const auto value = [&](int64_t l, int64_t kk) -> uint32_t {
    return l < lines && kk < k ? decode(src[kk * ld + l]) : 0u;
  };
  for (int64_t l = 0; l < amx::kTileRows; ++l) {
    for (int64_t p = blocked; p < padded_pairs; ++p) {
      out[amx::strip_offset(l, p)] = value(l, 2 * p) | value(l, 2 * p + 1) << 16;
    }
  }
}

// pack_pairs for a panel whose lines are rows of a transposed B [n, k] (the forward GEMMs,
// y = x W^T): value (l, kk) is src[l ld + kk], and out takes kCols lines. A pair row of the
// panel gathers one dword from each line, so blocks of 16 lines x 16 pairs are read as 16
// contiguous runs, transposed in registers and stored as 16 runs of pair rows; the pairs past
// the last whole block go one by one.
template <class T>
[[MANTISSA_AVX512_BF16]] void pack_pairs_from_rows(const T* src, int64_t ld, int64_t lines,
                                                   int64_t k, uint32_t* out) {
  const auto decode = bf16_decoder<T>();
  const Fp8Table table = load_fp8_table<T>();
  const int64_t blocked = k / 2 / 16 * 16;  // pairs in whole blocks of 16
  for (int64_t p0 = 0; p0 < blocked; p0 += 16) {
    for (int64_t l0 = 0; l0 < kCols; l0 += 16) {
      __m512i r[16];
      for (int64_t l = 0; l < 16; ++l) {
        // A line's 16 pairs are its 32 values in order.
        r[l] = l0 + l < lines ? bf16_words(src + (l0 + l) * ld + 2 * p0, ~__mmask32{0}, table)
                              : _mm512_setzero_si512();
      }
      transpose16x16(r);
      for (int64_t q = 0; q < 16; ++q) _mm512_storeu_si512(out + (p0 + q) * kCols + l0, r[q]);
    }
  }
  const auto value = [&](int64_t l, int64_t kk) -> uint32_t {
    return l < lines && kk < k ? decode(src[l * ld + kk]) : 0u;
  };
  for (int64_t p = blocked; p < (k + 1) / 2; ++p) {
    for (int64_t l = 0; l < kCols; ++l)
      out[p * kCols + l] = value(l, 2 * p) | value(l, 2 * p + 1) << 16;
  }
}

// pack_pairs for a panel whose lines are columns of B [k, n] (the backward GEMMs): value
// (l, kk) is src[kk ld + l], so each pair row of the panel interleaves two runs of source
// rows, widened and decoded 32 lines at a time.
template <class T>
[[MANTISSA_AVX512_BF16]] void pack_pairs_from_columns(const T* src, int64_t ld, int64_t lines,
                                                      int64_t k, uint32_t* out) {
  static_assert(kCols == 32, "one pair row of a panel is 32 lines");
  const auto decode = bf16_decoder<T>();
  const Fp8Table table = load_fp8_table<T>();
  const __mmask32 valid = lines >= 32 ? ~__mmask32{0} : (__mmask32{1} << lines) - 1;
  for (int64_t p = 0; p < k / 2; ++p) {
    const __m512i lo = bf16_words(src + 2 * p * ld, valid, table);
    const __m512i hi = bf16_words(src + (2 * p + 1) * ld, valid, table);
    for (int half = 0; half < 2; ++half) {
      const __m512i low = _mm512_cvtepu16_epi32(half ? _mm512_extracti64x4_epi64(lo, 1)
                                                     : _mm512_castsi512_si256(lo));
      const __m512i high = _mm512_cvtepu16_epi32(half ? _mm512_extracti64x4_epi64(hi, 1)
                                                      : _mm512_castsi512_si256(hi));
      _mm512_storeu_si512(out + p * kCols + 16 * half,
                          _mm512_or_si512(low, _mm512_slli_epi32(high, 16)));
    }
  }
  if (k % 2 == 1) {  // the last pair holds one value
    uint32_t* dst = out + k / 2 * kCols;
    for (int64_t l = 0; l < kCols; ++l) dst[l] = l < lines ? decode(src[(k - 1) * ld + l]) : 0u;
  }
}

// acc[r][half] += the strip's k pairs [p0, p1) times the panel's, by VDPBF16PS: each B pair
// vector meets the broadcast pair of every row of the strip.
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline void add_pairs(const uint32_t* a,
                                                                   const uint32_t* b, int64_t p0,
                                                                   int64_t p1,
                                                                   __m512 (&acc)[kRows][2]) {
  for (int64_t p = p0; p < p1; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b + p * kCols);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b + p * kCols + 16);
#pragma GCC unroll 12
    for (int64_t r = 0; r < kRows; ++r) {
      const __m512bh a_pair = (__m512bh)_mm512_set1_epi32(static_cast<int>(a[p * kRows + r]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a_pair, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a_pair, b1);
    }
  }
}

// The sums of columns [16 half, 16 half + 16) of row r of a tile held in accumulators, or in
// an FP32 tile in memory.
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline __m512 tile_sums(const __m512 (&acc)[kRows][2],
                                                                     int64_t r, int64_t half) {
  return acc[r][half];
}
template <size_t R>
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline __m512 tile_sums(const float (&total)[R][kCols],
                                                                     int64_t r, int64_t half) {
  return _mm512_load_ps(&total[r][16 * half]);
}

// C[rows, cols] (at most R x kCols, row stride ldc) = alpha * tile + beta * C. The loop over r
// is unrolled, so that a tile held in registers is indexed by constants.
template <int64_t R, class TC, class Tile>
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline void store_tile(const Tile& tile, float alpha,
                                                                    float beta, TC* c, int64_t ldc,
                                                                    int64_t rows, int64_t cols) {
  const __m512 alpha_v = _mm512_set1_ps(alpha);
  const __m512 beta_v = _mm512_set1_ps(beta);
  const auto mask = [](int64_t n) {
    return static_cast<__mmask16>(n >= 16 ? 0xFFFF : n <= 0 ? 0 : (1u << n) - 1);
  };
  const __mmask16 mask0 = mask(cols), mask1 = mask(cols - 16);
#pragma GCC unroll 12
  for (int64_t r = 0; r < R; ++r) {
    if (r >= rows) break;
    // The second half is addressed only when the tile has columns there (past the end of C
    // otherwise).
    for (int64_t half = 0; half < 2 && 16 * half < cols; ++half) {
      TC* out = c + r * ldc + 16 * half;
      const __mmask16 valid = half == 0 ? mask0 : mask1;
      __m512 v = _mm512_mul_ps(alpha_v, tile_sums(tile, r, half));
      if (beta != 0.0f) v = _mm512_fmadd_ps(beta_v, load16(out, valid), v);
      store16(out, valid, v);
    }
  }
}

// C[rows, cols] (at most kRows x kCols, row stride ldc) = alpha * strip . panel + beta * C.
template <class TC>
[[MANTISSA_AVX512_BF16]] void micro_tile(const uint32_t* a, const uint32_t* b, int64_t pairs,
                                         float alpha, float beta, TC* c, int64_t ldc, int64_t rows,
                                         int64_t cols) {
  __m512 acc[kRows][2];
  for (int64_t r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  add_pairs(a, b, 0, pairs, acc);
  store_tile<kRows>(acc, alpha, beta, c, ldc, rows, cols);
}

// One row of a K-block's fold (cpu_gemm_block_scales.h): total = fma(sa sb, sums, total)
// over the row's kCols columns, sums0 and sums1 being its two halves; the first block reads
// total as +0.
[[MANTISSA_AVX512_BF16, gnu::always_inline]] inline void fold_row(float (&total)[kCols], float sa,
                                                                  __m512 sb0, __m512 sb1,
                                                                  __m512 sums0, __m512 sums1,
                                                                  bool first) {
  const __m512 s = _mm512_set1_ps(sa);
  const __m512 before0 = first ? _mm512_setzero_ps() : _mm512_load_ps(&total[0]);
  const __m512 before1 = first ? _mm512_setzero_ps() : _mm512_load_ps(&total[16]);
  _mm512_store_ps(&total[0], _mm512_fmadd_ps(_mm512_mul_ps(s, sb0), sums0, before0));
  _mm512_store_ps(&total[16], _mm512_fmadd_ps(_mm512_mul_ps(s, sb1), sums1, before1));
}

// The same tile with block scales (cpu_gemm_block_scales.h): sa and sb point at the scales
// of the tile's first row and column in K-block 0. Each block's pairs are summed from 0 in
// the accumulators (VDPBF16PS as above) and folded into `total`, an FP32 tile in L1:
// total = fma(sa sb, sums, total), total starting at +0; then C = alpha * total + beta * C.
template <class TC>
[[MANTISSA_AVX512_BF16]] void micro_tile_scaled(const uint32_t* a, const uint32_t* b, int64_t pairs,
                                                const BlockScales& scales, const float* sa,
                                                const float* sb, float alpha, float beta, TC* c,
                                                int64_t ldc, int64_t rows, int64_t cols) {
  // block_k is even when it is less than K, so no pair straddles two blocks.
  const int64_t block_pairs = (scales.block_k + 1) / 2;
  alignas(64) float total[kRows][kCols];
  if (pairs == 0) std::fill_n(&total[0][0], kRows * kCols, 0.0f);  // K = 0: acc stays +0
  for (int64_t p0 = 0, block = 0; p0 < pairs; p0 += block_pairs, ++block) {
    __m512 acc[kRows][2];
    for (int64_t r = 0; r < kRows; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    add_pairs(a, b, p0, std::min(pairs, p0 + block_pairs), acc);
    const float* sa_block = sa + block * scales.a_stride;
    const float* sb_block = sb + block * scales.b_stride;
    const __m512 sb0 = _mm512_loadu_ps(sb_block), sb1 = _mm512_loadu_ps(sb_block + 16);
#pragma GCC unroll 12
    for (int64_t r = 0; r < kRows; ++r) {
      fold_row(total[r], sa_block[r], sb0, sb1, acc[r][0], acc[r][1], block == 0);
    }
  }
  store_tile<kRows>(total, alpha, beta, c, ldc, rows, cols);
}

// C[rows, cols] (at most amx::kTileRows x kCols) = alpha * strip . panel + beta * C, on AMX
// tiles, over all padded_pairs pairs (K's and the zero padding).
template <class TC>
[[MANTISSA_AVX512_BF16]] void amx_tile(const uint32_t* strip, const uint32_t* panel,
                                       int64_t padded_pairs, float alpha, float beta, TC* c,
                                       int64_t ldc, int64_t rows, int64_t cols) {
  alignas(64) float total[amx::kTileRows][kCols];
  amx::micro_tile(strip, panel, 0, padded_pairs, total);
  store_tile<amx::kTileRows>(total, alpha, beta, c, ldc, rows, cols);
}

// The same tile with block scales, as micro_tile_scaled: each K-block's pairs summed on the
// tiles from 0 (blocks of a whole number of AMX steps; the last block takes the padding) and
// folded by fold_row.
template <class TC>
[[MANTISSA_AVX512_BF16]] void amx_tile_scaled(const uint32_t* strip, const uint32_t* panel,
                                              int64_t pairs, int64_t padded_pairs,
                                              const BlockScales& scales, const float* sa,
                                              const float* sb, float alpha, float beta, TC* c,
                                              int64_t ldc, int64_t rows, int64_t cols) {
  const int64_t block_pairs = (scales.block_k + 1) / 2;
  alignas(64) float sums[amx::kTileRows][kCols];
  alignas(64) float total[amx::kTileRows][kCols];
  if (pairs == 0) std::fill_n(&total[0][0], amx::kTileRows * kCols, 0.0f);  // K = 0
  for (int64_t p0 = 0, block = 0; p0 < pairs; p0 += block_pairs, ++block) {
    const bool last = p0 + block_pairs >= pairs;
    amx::micro_tile(strip, panel, p0, last ? padded_pairs : p0 + block_pairs, sums);
    const float* sa_block = sa + block * scales.a_stride;
    const float* sb_block = sb + block * scales.b_stride;
    const __m512 sb0 = _mm512_loadu_ps(sb_block), sb1 = _mm512_loadu_ps(sb_block + 16);
    for (int64_t r = 0; r < amx::kTileRows; ++r) {
      fold_row(total[r], sa_block[r], sb0, sb1, _mm512_load_ps(&sums[r][0]),
               _mm512_load_ps(&sums[r][16]), block == 0);
    }
  }
  store_tile<amx::kTileRows>(total, alpha, beta, c, ldc, rows, cols);
}

#pragma GCC diagnostic pop

// The packed operands of the calling thread's GEMMs, shared by every operand-type
// instantiation of gemm_packed and gemm_packed_amx.
struct PackBuffers {
  ScratchBuffer<uint32_t> a, b;
};

PackBuffers& pack_buffers_of_this_thread() {
  thread_local PackBuffers buffers;
  return buffers;
}

// How a GEMM of s.batch products, each of `strips` strips and `panels` panels, is spread over
// the threads: every product's strips cut into row parts and its panels into column parts,
// enough work items that each thread gets the same share; each item passes its strips over
// one block of panels (about kBlockBytes of packed B) at a time.
struct WorkSplit {
  int64_t strips, panels, row_parts, col_parts, block_panels;
  bool parallel;

  WorkSplit(const GemmShape& s, int64_t strips_, int64_t panels_, int64_t panel_dwords)
      : strips(strips_), panels(panels_) {
    const int64_t threads = omp_get_max_threads();
    const double flops = 2.0 * static_cast<double>(s.batch * s.m) * static_cast<double>(s.n * s.k);
    parallel = threads > 1 && flops >= kGemmParallelFlops;
    const int64_t per_product = parallel ? threads / std::gcd(s.batch, threads) : 1;
    row_parts = std::clamp<int64_t>(per_product, 1, std::max<int64_t>(1, strips));
    col_parts =
        std::clamp<int64_t>(ceil_div(per_product, row_parts), 1, std::max<int64_t>(1, panels));
    block_panels = std::max<int64_t>(1, kBlockBytes / std::max<int64_t>(1, panel_dwords * 4));
  }

  int64_t items(int64_t batch) const { return batch * row_parts * col_parts; }

  // visit(product, strip, panel) for every tile of work item `item`, in its order.
  template <class Visit>
  void for_tiles_of(int64_t item, const Visit& visit) const {
    const int64_t product = item / (row_parts * col_parts);
    const int64_t row_part = item / col_parts % row_parts, col_part = item % col_parts;
    const int64_t strip_begin = strips * row_part / row_parts;
    const int64_t strip_end = strips * (row_part + 1) / row_parts;
    const int64_t panel_begin = panels * col_part / col_parts;
    const int64_t panel_end = panels * (col_part + 1) / col_parts;
    for (int64_t block = panel_begin; block < panel_end; block += block_panels) {
      for (int64_t strip = strip_begin; strip < strip_end; ++strip) {
        for (int64_t panel = block; panel < std::min(panel_end, block + block_panels); ++panel) {
          visit(product, strip, panel);
        }
      }
    }
  }
};

// Where one GEMM's operands are packed: strips of `strip_rows` rows of op(A) and panels of
// kCols columns of op(B), `pairs` K pairs each, in the calling thread's buffers.
struct PackedOperands {
  int64_t pairs, strips, panels, strip_size, panel_size;  // sizes in dwords (BF16 pairs)
  uint32_t *a, *b;

  PackedOperands(const GemmShape& s, int64_t strip_rows, int64_t pairs_)
      : pairs(pairs_),
        strips(ceil_div(s.m, strip_rows)),
        panels(ceil_div(s.n, kCols)),
        strip_size(pairs_ * strip_rows),
        panel_size(pairs_ * kCols) {
    PackBuffers& buffers = pack_buffers_of_this_thread();
    a = buffers.a.get(s.batch * strips * strip_size);
    b = buffers.b.get(s.batch * panels * panel_size);
  }
};

// Packs every product's panels, shared out over the threads of the enclosing parallel region:
// panel columns [j, j + kCols) of op(B) are columns of B, or rows of a transposed B [n, k],
// zero past K's pairs.
template <class TB>
void pack_panels(const GemmShape& s, const TB* b, bool trans_b, const PackedOperands& to) {
#pragma omp for schedule(static)
  for (int64_t i = 0; i < s.batch * to.panels; ++i) {
    const int64_t j = i % to.panels * kCols;
    const TB* b_product = b + i / to.panels * s.k * s.n;
    uint32_t* out = to.b + i * to.panel_size;
    const int64_t lines = std::min(kCols, s.n - j);
    if (trans_b) {
      pack_pairs_from_rows(b_product + j * s.k, s.k, lines, s.k, out);
    } else {
      pack_pairs_from_columns(b_product + j, s.n, lines, s.k, out);
    }
    std::fill(out + (s.k + 1) / 2 * kCols, out + to.panel_size, 0u);
  }
}

// The two engines gemm_packed runs on. Each says how many rows of op(A) a strip holds, how
// many K pairs are packed (K's, with any padding the engine needs), how a strip is packed,
// what a thread does before and after its tiles, and how one tile of C is computed; the
// packing of panels, the work split and the threads are gemm_packed's.
struct Vdpbf16psEngine {
  static constexpr int64_t kStripRows = kRows;
  static int64_t packed_pairs(int64_t k) { return (k + 1) / 2; }
  template <class T>
  static void pack_strip(const T* src, bool k_major, int64_t ld, int64_t lines, int64_t k,
                         int64_t /*pairs*/, uint32_t* out) {
    pack_pairs(src, k_major, ld, lines, k, kRows, out);
  }
  static void begin_tiles() {}
  static void end_tiles() {}
  template <class TC>
  static void tile(const uint32_t* strip, const uint32_t* panel, int64_t pairs, int64_t /*packed*/,
                   const BlockScales* scales, int64_t row, int64_t col, float alpha, float beta,
                   TC* c, int64_t ldc, int64_t rows, int64_t cols) {
    if (scales != nullptr) {
      return micro_tile_scaled(strip, panel, pairs, *scales, scales->a + row, scales->b + col,
                               alpha, beta, c, ldc, rows, cols);
    }
    micro_tile(strip, panel, pairs, alpha, beta, c, ldc, rows, cols);
  }
};

// Strips of amx::kTileRows rows packed step by step (pack_rows, amx::strip_offset), K padded with
// zero pairs to whole steps of amx::kPairsPerStep, and each thread's tile configuration loaded
// around its tiles.
struct AmxEngine {
  static_assert(amx::kTileCols == kCols, "AMX tiles read the panels of the VDPBF16PS kernel");
  static constexpr int64_t kStripRows = amx::kTileRows;
  static int64_t packed_pairs(int64_t k) {
    const int64_t step = amx::kPairsPerStep;
    return round_up(ceil_div(k, 2), step);
  }
  template <class T>
  static void pack_strip(const T* src, bool k_major, int64_t ld, int64_t lines, int64_t k,
                         int64_t pairs, uint32_t* out) {
    if (k_major) return pack_rows_transposed(src, ld, lines, k, pairs, out);
    pack_rows(src, ld, lines, k, pairs, out);
  }
  static void begin_tiles() { amx::configure_thread(); }
  static void end_tiles() { amx::release_thread(); }
  template <class TC>
  static void tile(const uint32_t* strip, const uint32_t* panel, int64_t pairs, int64_t packed,
                   const BlockScales* scales, int64_t row, int64_t col, float alpha, float beta,
                   TC* c, int64_t ldc, int64_t rows, int64_t cols) {
    if (scales != nullptr) {
      return amx_tile_scaled(strip, panel, pairs, packed, *scales, scales->a + row, scales->b + col,
                             alpha, beta, c, ldc, rows, cols);
    }
    amx_tile(strip, panel, packed, alpha, beta, c, ldc, rows, cols);
  }

  // Whether the tiles take these scales: none, or K-blocks of whole AMX steps, or one block.
  static bool takes(const GemmShape& s, const BlockScales* scales) {
    return scales == nullptr || scales->block_k >= s.k ||
           scales->block_k % (2 * amx::kPairsPerStep) == 0;
  }
};

// The GEMM on `Engine`. `scales`: null, or the block scales of the one product (s.batch = 1).
template <class Engine, class TA, class TB, class TC>
void gemm_packed(const GemmShape& s, const TA* a, bool trans_a, const TB* b, bool trans_b,
                 float alpha, float beta, TC* c, const BlockScales* scales) {
  constexpr int64_t kStripRows = Engine::kStripRows;
  const PackedOperands packed(s, kStripRows, Engine::packed_pairs(s.k));
  const auto [pairs, strips, panels, strip_size, panel_size, packed_a, packed_b] = packed;
  const WorkSplit split(s, strips, panels, panel_size);

#pragma omp parallel if (split.parallel)
  {
#pragma omp for schedule(static)
    for (int64_t i = 0; i < s.batch * strips; ++i) {
      // Strip rows [r, r + kStripRows) of op(A): rows of A, or columns of a transposed A [k, m].
      const int64_t r = i % strips * kStripRows;
      const TA* a_product = a + i / strips * s.m * s.k;
      Engine::pack_strip(a_product + (trans_a ? r : r * s.k), trans_a, trans_a ? s.m : s.k,
                         std::min(kStripRows, s.m - r), s.k, pairs, packed_a + i * strip_size);
    }
    pack_panels(s, b, trans_b, packed);
    Engine::begin_tiles();
#pragma omp for schedule(static)
    for (int64_t item = 0; item < split.items(s.batch); ++item) {
      split.for_tiles_of(item, [&](int64_t product, int64_t strip, int64_t panel) {
        const int64_t row = strip * kStripRows, col = panel * kCols;
        Engine::tile(packed_a + (product * strips + strip) * strip_size,
                     packed_b + (product * panels + panel) * panel_size, (s.k + 1) / 2, pairs,
                     scales, row, col, alpha, beta, c + product * s.m * s.n + row * s.n + col, s.n,
                     std::min(kStripRows, s.m - row), std::min(kCols, s.n - col));
      });
    }
    Engine::end_tiles();
  }
}

// The GEMM on the fastest engine this CPU has for it.
template <class TA, class TB, class TC>
void gemm_typed(const GemmShape& s, const TA* a, bool trans_a, const TB* b, bool trans_b,
                float alpha, float beta, TC* c, const BlockScales* scales) {
  if (amx::enabled() && AmxEngine::takes(s, scales)) {
    return gemm_packed<AmxEngine>(s, a, trans_a, b, trans_b, alpha, beta, c, scales);
  }
  gemm_packed<Vdpbf16psEngine>(s, a, trans_a, b, trans_b, alpha, beta, c, scales);
}

template <class TA, class TC>
void gemm_with_a(const GemmShape& s, const TA* a, bool trans_a, const Tensor& b, bool trans_b,
                 float alpha, float beta, TC* c, const BlockScales* scales) {
  switch (b.dtype()) {
    case DType::kBF16:
      return gemm_typed(s, a, trans_a, b.data_as<const bf16>(), trans_b, alpha, beta, c, scales);
    case DType::kE4M3:
      return gemm_typed(s, a, trans_a, b.data_as<const fp8_e4m3>(), trans_b, alpha, beta, c,
                        scales);
    case DType::kE5M2:
      return gemm_typed(s, a, trans_a, b.data_as<const fp8_e5m2>(), trans_b, alpha, beta, c,
                        scales);
    default: MANTISSA_FAIL("gemm_bf16: B is " << b.describe() << ", not BF16 or FP8");
  }
}

template <class TC>
void with_typed_a(const GemmShape& s, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
                  float alpha, float beta, TC* c, const BlockScales* scales) {
  switch (a.dtype()) {
    case DType::kBF16:
      return gemm_with_a(s, a.data_as<const bf16>(), trans_a, b, trans_b, alpha, beta, c, scales);
    case DType::kE4M3:
      return gemm_with_a(s, a.data_as<const fp8_e4m3>(), trans_a, b, trans_b, alpha, beta, c,
                         scales);
    case DType::kE5M2:
      return gemm_with_a(s, a.data_as<const fp8_e5m2>(), trans_a, b, trans_b, alpha, beta, c,
                         scales);
    default: MANTISSA_FAIL("gemm_bf16: A is " << a.describe() << ", not BF16 or FP8");
  }
}

}  // namespace

bool bf16_gemm_enabled() {
  static const bool enabled = [] {
    return env_switch_on(kBf16GemmSwitch) && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512bf16");
  }();
  return enabled;
}

bool bf16_gemm_supports(DType a, DType b) {
  return (a == DType::kBF16 && b == DType::kBF16) || (is_fp8(a) && is_fp8(b));
}

void gemm_bf16(const GemmShape& s, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
               float alpha, float beta, void* c, DType c_dtype, const BlockScales* scales) {
  MANTISSA_CHECK(bf16_gemm_enabled() && bf16_gemm_supports(a.dtype(), b.dtype()) && alpha != 0.0f &&
                     (c_dtype == DType::kF32 || c_dtype == DType::kBF16),
                 "gemm_bf16: called for A " << a.describe() << ", B " << b.describe() << ", C "
                                            << dtype_name(c_dtype) << ", alpha " << alpha
                                            << " it does not take");
  MANTISSA_CHECK(scales == nullptr || (s.batch == 1 && scales->block_k > 0 &&
                                       (scales->block_k % 2 == 0 || scales->block_k >= s.k)),
                 "gemm_bf16: block scales need one product and K-blocks of an even length (or "
                 "one block), not batch "
                     << s.batch << " with block_k " << (scales ? scales->block_k : 0));
  if (c_dtype == DType::kBF16) {
    return with_typed_a(s, a, trans_a, b, trans_b, alpha, beta, static_cast<bf16*>(c), scales);
  }
  with_typed_a(s, a, trans_a, b, trans_b, alpha, beta, static_cast<float*>(c), scales);
}

void gemm_bf16(const GemmShape& s, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
               float alpha, float beta, float* c) {
  gemm_bf16(s, a, trans_a, b, trans_b, alpha, beta, c, DType::kF32);
}

}  // namespace mantissa::core
