// GEMM with AVX2 and FMA on operands widened to FP32 while they are packed.
//
// The layout is the classic one of BLIS and OpenBLAS (Goto's algorithm), in FP32:
//  - op(B) is packed in panels of kNr columns, each K block of kKc rows (k) of a panel
//    contiguous: value (k, j) at [k kNr + j], zeros past the matrix's last column.
//  - op(A) is packed a block of up to kMc rows by one K block at a time, in strips of kMr
//    rows: value (i, k) of a strip at [k kMr + i], zeros past the last row.
//  - Packing is where BF16, F16 and FP8 codes become FP32 (exactly, decode8 of
//    cpu_convert8.h), so the widened copy only ever exists a cache-sized block at a time, and
//    the micro-tile reads FP32 only.
//  - A micro-tile is kMr x kNr = 6 x 16 of C: 12 accumulator vectors of 8 lanes, two B
//    vectors per k and each A value broadcast (15 of the 16 AVX2 registers). The B panel of
//    one K block (kKc x 16 FP32, 16 KiB) stays in L1 while the strips of the A block, in L2,
//    pass over it.
// K blocks do not change the arithmetic: a micro-tile of a later block starts from the raw
// FP32 partial sums the previous block stored, so each element is still one FP32 sum over
// k = 0 .. K-1 in increasing order, whatever kKc is. alpha and beta are applied once, when the
// last block finishes the sum. Where beta != 0 the old C must survive until then, so the
// partial sums of a multi-block K go to a scratch buffer instead of C.
//
// With block scales (cpu_gemm_block_scales.h) the K blocks start and end on the scales' block
// boundaries (a K block is whole scale blocks, up to kKc elements of K), and a micro-tile sums
// each scale block from 0 in its accumulators and folds the sums into the scaled accumulator
// (the tile's running value, in L1; between K blocks where partial sums would be). A product
// whose scales cover all of K (one block, however long) keeps the raw sums across K blocks and
// folds them once, when the last K block finishes.
//
// Threads (OpenMP, OMP_NUM_THREADS of them): a product shared by all threads has each column
// block of op(B) packed once, by all of them, and its blocks of rows handed out dynamically
// (gemm_all_threads); whole products go to threads when the batch divides evenly, and a C
// with too few rows for large blocks of them is cut into column slices. No split ever cuts K, so
// results do not depend on the thread count.
#include "core/ops/cpu/cpu_gemm_avx2.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <type_traits>
#include <utility>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/int_math.h"
#include "core/ops/cpu/cpu_convert8.h"
#include "core/ops/cpu/cpu_gemm_bf16.h"
#include "core/ops/cpu/cpu_gemm_block_scales.h"
#include "core/ops/cpu/cpu_transpose8.h"
#include "core/ops/cpu/scratch_buffer.h"

#if !defined(__AVX2__) || !defined(__FMA__)
#error "cpu_gemm_avx2.cpp needs AVX2 and FMA (build with -march=x86-64-v3)"
#endif

namespace mantissa::core {
namespace {

constexpr int64_t kMr = 6;    // rows of C per micro-tile
constexpr int64_t kNr = 16;   // columns of C per micro-tile: two vectors of 8 FP32
constexpr int64_t kKc = 256;  // k per block: a packed B panel is kKc x kNr FP32 = 16 KiB (L1)
constexpr int64_t kMc = 144;  // rows per packed A block: kMc x kKc FP32 = 144 KiB (L2)
// Packed op(B) of one block of columns over all of K: at most this many bytes. Each panel is
// fetched from wherever it lies (L2, L3) once per block of rows and then reused from L1 by
// every strip of the block, so the block need not fit any cache; the bound is on memory.
constexpr int64_t kPackedBBytes = 4 << 20;
constexpr int64_t kMinSlice = 32;  // columns of C per thread's slice, at least
// Blocks of rows per thread, at least, when the threads share a product: enough that a
// thread slowed down by another process on its core delays the product by a small block.
constexpr int64_t kRowBlocksPerThread = 4;
constexpr int kSpinsBeforeYield = 1024;  // tens of microseconds of pause instructions
// A strip is stored eight floats at a time (six useful, the next two overwritten by the next
// store): the last store of a buffer runs this far past its end.
constexpr int64_t kPackSlack = 8;

// One operand seen as `lines` (rows of op(A), columns of op(B)) of K values each: value
// (l, k) is data[k ld + l] when k_major, else data[l ld + k]. When k_major, the lines of one
// k are contiguous and `readable` of them (from line 0) lie inside the stored rows, so a
// vector load may read past the lines a block needs as long as it stays below `readable`.
template <class T>
struct Lines {
  const T* data;
  bool k_major;
  int64_t ld;
  int64_t readable;

  const T* at(int64_t line, int64_t k) const {
    return data + (k_major ? k * ld + line : line * ld + k);
  }
};

// Packs lines [l0, l0 + lines) over k [k0, k0 + kc) of `src` as FP32 for a strip or panel of
// `Width` lines: value (l0 + l, k0 + p) goes to out[p Width + l], zero for lines <= l < Width.
// Stores are of eight floats; for Width 6 each overlaps the next (see kPackSlack).
template <int64_t Width, class T>
void pack(const Lines<T>& src, int64_t l0, int64_t lines, int64_t k0, int64_t kc, float* out) {
  static_assert(Width == kMr || Width == kNr);
  if (src.k_major && lines == Width && l0 + round_up(Width, 8) <= src.readable) {
    // The lines of one k are contiguous: widen them eight at a time.
    for (int64_t p = 0; p < kc; ++p) {
      const T* in = src.at(l0, k0 + p);
      for (int64_t l = 0; l < Width; l += 8) _mm256_storeu_ps(out + p * Width + l, decode8(in + l));
    }
    return;
  }
  int64_t p = 0;
  if (!src.k_major) {
    // Each line is contiguous in k: widen 8 k of 8 lines, transpose, store 8 lines per k.
    for (; p + 8 <= kc; p += 8) {
      for (int64_t g = 0; g < Width; g += 8) {
        __m256 r[8];
        for (int64_t i = 0; i < 8; ++i) {
          r[i] = g + i < lines ? decode8(src.at(l0 + g + i, k0 + p)) : _mm256_setzero_ps();
        }
        transpose8(r);
        for (int64_t q = 0; q < 8; ++q) _mm256_storeu_ps(out + (p + q) * Width + g, r[q]);
      }
    }
  }
  for (; p < kc; ++p) {
    for (int64_t l = 0; l < Width; ++l) {
      out[p * Width + l] = l < lines ? to_float(*src.at(l0 + l, k0 + p)) : 0.0f;
    }
  }
}

// What the last K block does with a tile's sums: C = alpha * sum + beta * C; with scales
// (of the one product, or of the column slice C starts at) the sum is the scaled accumulator.
struct Finish {
  float alpha;
  float beta;
  const BlockScales* scales = nullptr;
};

// The scales of a micro-tile over one K block: a and b point at those of the tile's first row
// and column in the first scale block of the K block. `in_blocks`: K is cut into scale blocks
// of block_k, each folded at its end; otherwise one block covers all of K and is folded after
// the last K block.
struct TileScales {
  const float* a;
  int64_t a_stride;
  const float* b;
  int64_t b_stride;
  int64_t block_k;
  bool in_blocks;
};

// Eight values of C as FP32, and back: an FP32 C as it is, a BF16 C widened and rounded to
// nearest even (bf16_from_float, the rounding narrow_from_f32 would apply).
__m256 load8(const float* p) {
  return _mm256_loadu_ps(p);
}
__m256 load8(const bf16* p) {
  return decode8(p);
}
void store8(float* p, __m256 v) {
  _mm256_storeu_ps(p, v);
}
void store8(bf16* p, __m256 v) {
  const __m256i codes = bf16_round8(v);
  const __m128i packed =
      _mm_packus_epi32(_mm256_castsi256_si128(codes), _mm256_extracti128_si256(codes, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}

// The accumulators of one kMr x kNr micro-tile: row r, columns 8h .. 8h + 7 in acc[r][h].
struct Accumulators {
  __m256 acc[kMr][2];
};

// acc = init (or 0 when init is null) + the product of a packed strip a and panel b over kc
// values of k, one fused multiply-add per k in increasing order.
[[gnu::always_inline]] inline void accumulate(Accumulators& t, int64_t kc, const float* a,
                                              const float* b, const float* init, int64_t ld_init) {
#pragma GCC unroll 6
  for (int64_t r = 0; r < kMr; ++r) {
    t.acc[r][0] = init ? _mm256_loadu_ps(init + r * ld_init) : _mm256_setzero_ps();
    t.acc[r][1] = init ? _mm256_loadu_ps(init + r * ld_init + 8) : _mm256_setzero_ps();
  }
#pragma GCC unroll 4
  for (int64_t p = 0; p < kc; ++p) {
    const __m256 b0 = _mm256_loadu_ps(b + p * kNr);
    const __m256 b1 = _mm256_loadu_ps(b + p * kNr + 8);
#pragma GCC unroll 6
    for (int64_t r = 0; r < kMr; ++r) {
      const __m256 x = _mm256_broadcast_ss(a + p * kMr + r);
      t.acc[r][0] = _mm256_fmadd_ps(x, b0, t.acc[r][0]);
      t.acc[r][1] = _mm256_fmadd_ps(x, b1, t.acc[r][1]);
    }
  }
}

// t = fma(sa sb, t, before) lane by lane, before being +0 where null: one scale block's sums
// folded into the scaled accumulator. sa: the tile's rows' scales, sb: its columns'.
[[gnu::always_inline]] inline void fold(Accumulators& t, const float* sa, const float* sb,
                                        const float* before, int64_t ld_before) {
  const __m256 sb0 = _mm256_loadu_ps(sb), sb1 = _mm256_loadu_ps(sb + 8);
#pragma GCC unroll 6
  for (int64_t r = 0; r < kMr; ++r) {
    const __m256 s = _mm256_broadcast_ss(sa + r);
    const __m256 b0 = before ? _mm256_loadu_ps(before + r * ld_before) : _mm256_setzero_ps();
    const __m256 b1 = before ? _mm256_loadu_ps(before + r * ld_before + 8) : _mm256_setzero_ps();
    t.acc[r][0] = _mm256_fmadd_ps(_mm256_mul_ps(s, sb0), t.acc[r][0], b0);
    t.acc[r][1] = _mm256_fmadd_ps(_mm256_mul_ps(s, sb1), t.acc[r][1], b1);
  }
}

// The tile's accumulators after a K block of kc values of k, continuing init (from 0 when
// init is null): without scales the raw FP32 sums; with scales in blocks the scaled
// accumulator, each scale block summed from 0 and folded (the running value between two
// blocks kept in L1); with one scale block the raw sums, folded once (onto +0) when `last`.
[[gnu::always_inline]] inline void tile_sums(Accumulators& t, int64_t kc, const float* a,
                                             const float* b, const float* init, int64_t ld_init,
                                             const TileScales* scales, bool last) {
  if (scales == nullptr || !scales->in_blocks) {
    accumulate(t, kc, a, b, init, ld_init);
    if (scales != nullptr && last) fold(t, scales->a, scales->b, nullptr, 0);
    return;
  }
  alignas(32) float running[kMr * kNr];
  const float* before = init;
  int64_t ld_before = ld_init;
  for (int64_t p0 = 0, block = 0;; ++block) {
    accumulate(t, std::min(scales->block_k, kc - p0), a + p0 * kMr, b + p0 * kNr, nullptr, 0);
    fold(t, scales->a + block * scales->a_stride, scales->b + block * scales->b_stride, before,
         ld_before);
    p0 += scales->block_k;
    if (p0 >= kc) return;
    for (int64_t r = 0; r < kMr; ++r) {
      _mm256_store_ps(running + r * kNr, t.acc[r][0]);
      _mm256_store_ps(running + r * kNr + 8, t.acc[r][1]);
    }
    before = running;
    ld_before = kNr;
  }
}

// A full micro-tile of a K block before the last: dst = the raw partial sums (with scales in
// blocks: the scaled accumulator).
void partial_tile(int64_t kc, const float* a, const float* b, const float* init, int64_t ld_init,
                  float* dst, int64_t ld_dst, const TileScales* scales) {
  Accumulators t;
  tile_sums(t, kc, a, b, init, ld_init, scales, false);
#pragma GCC unroll 6
  for (int64_t r = 0; r < kMr; ++r) {
    _mm256_storeu_ps(dst + r * ld_dst, t.acc[r][0]);
    _mm256_storeu_ps(dst + r * ld_dst + 8, t.acc[r][1]);
  }
}

// A full micro-tile of the last K block: C = alpha * sum + beta * C (C read only when
// beta != 0).
template <class TC>
void final_tile(int64_t kc, const float* a, const float* b, const float* init, int64_t ld_init,
                TC* c, int64_t ldc, const Finish& finish, const TileScales* scales) {
  Accumulators t;
  tile_sums(t, kc, a, b, init, ld_init, scales, true);
  const __m256 alpha = _mm256_set1_ps(finish.alpha);
  const __m256 beta = _mm256_set1_ps(finish.beta);
  const bool read_c = finish.beta != 0.0f;
#pragma GCC unroll 6
  for (int64_t r = 0; r < kMr; ++r) {
    for (int64_t h = 0; h < 2; ++h) {
      TC* out = c + r * ldc + 8 * h;
      __m256 v = _mm256_mul_ps(alpha, t.acc[r][h]);
      if (read_c) v = _mm256_fmadd_ps(beta, load8(out), v);
      store8(out, v);
    }
  }
}

// A micro-tile at C's edge (rows < kMr or cols < kNr): the same full tile run on local
// copies, so its arithmetic is the full tile's; only the valid part is read and written.
// dst is the partial sums (FP32) when finish is null, else C.
template <class TC>
void edge_tile(int64_t kc, const float* a, const float* b, const float* init, int64_t ld_init,
               TC* dst, int64_t ld_dst, const Finish* finish, const TileScales* scales,
               int64_t rows, int64_t cols) {
  alignas(32) float init_tile[kMr * kNr] = {};
  alignas(32) TC out_tile[kMr * kNr] = {};
  const auto copy = [&](const auto* from, int64_t ld_from, auto* to, int64_t ld_to) {
    for (int64_t r = 0; r < rows; ++r) std::copy_n(from + r * ld_from, cols, to + r * ld_to);
  };
  if (init) copy(init, ld_init, init_tile, kNr);
  const float* local_init = init ? init_tile : nullptr;
  if constexpr (std::is_same_v<TC, float>) {
    if (finish == nullptr) {
      partial_tile(kc, a, b, local_init, kNr, out_tile, kNr, scales);
      copy(out_tile, kNr, dst, ld_dst);
      return;
    }
  }
  if (finish->beta != 0.0f) copy(dst, ld_dst, out_tile, kNr);
  final_tile(kc, a, b, local_init, kNr, out_tile, kNr, *finish, scales);
  copy(out_tile, kNr, dst, ld_dst);
}

// The calling thread's buffers: packed blocks of A and B, and partial sums that cannot live
// in C. They grow to the largest call and stay.
struct Buffers {
  ScratchBuffer<float> a, b, partial;
};

Buffers& buffers_of_this_thread() {
  thread_local Buffers buffers;
  return buffers;
}

// How one product C[m, n] is cut: K into k_blocks blocks of whole units (unit elements of K,
// the last unit shorter where K ends), at most kKc elements each where a unit allows, columns
// into blocks of nc (op(B) of one column block is packed for all of K, at most kPackedBBytes),
// rows into blocks of mc (op(A) of one row block is packed one K block at a time).
struct Blocking {
  int64_t k, unit, k_blocks, kc_max, nc, mc;

  // K block kb: [k0, k0 + kc).
  std::pair<int64_t, int64_t> k_range(int64_t kb) const {
    const int64_t units = ceil_div(k, unit);
    const int64_t k0 = std::min(k, units * kb / k_blocks * unit);
    return {k0, std::min(k, units * (kb + 1) / k_blocks * unit) - k0};
  }
};

// The unit of K blocks: 1, or the scale block where scales cut K into blocks.
int64_t k_unit(const Finish& finish, int64_t k) {
  return finish.scales != nullptr && finish.scales->block_k < k ? finish.scales->block_k : 1;
}

Blocking make_blocking(int64_t m, int64_t n, int64_t k, int64_t mc_limit, int64_t unit) {
  Blocking bl;
  bl.k = k;
  bl.unit = unit;
  const int64_t units = ceil_div(k, unit);
  bl.k_blocks = std::max<int64_t>(1, ceil_div(units, std::max<int64_t>(1, kKc / unit)));
  bl.kc_max = ceil_div(units, bl.k_blocks) * unit;
  const int64_t nc_limit = std::max(kNr, kPackedBBytes / (4 * std::max<int64_t>(k, 1)) / kNr * kNr);
  bl.nc = round_up(ceil_div(n, ceil_div(n, nc_limit)), kNr);
  bl.mc = round_up(ceil_div(m, ceil_div(m, mc_limit)), kMr);
  return bl;
}

// Packs item (K block, panel) = (item / panels, item % panels) of the column block at jc:
// K block kb's panels start at row k0 of the packed block, panel q at (k0 panels + q kc) kNr.
template <class TB>
void pack_b_item(const Lines<TB>& b, const Blocking& bl, int64_t jc, int64_t panels, int64_t n,
                 int64_t item, float* packed_b) {
  const auto [k0, kc] = bl.k_range(item / panels);
  const int64_t q = item % panels;
  const int64_t j = jc + q * kNr;
  pack<kNr>(b, j, std::min(kNr, n - j), k0, kc, packed_b + (k0 * panels + q * kc) * kNr);
}

// Rows [ic, ic + mb) by columns [jc, jc + nb) of C[m, n] (row stride ldc) over all of K, on
// the calling thread, against the packed column block packed_b: each K block packs its part
// of op(A) into this thread's buffer, and each B panel then stays in L1 while every strip of
// it passes over the panel. The rows' partial sums stay in L2 from one K block to the next.
template <class TA, class TC>
void row_block(const Lines<TA>& a, const Blocking& bl, int64_t ic, int64_t mb, int64_t jc,
               int64_t nb, const float* packed_b, const Finish& finish, TC* c, int64_t ldc,
               int64_t m, int64_t n) {
  Buffers& buffers = buffers_of_this_thread();
  float* packed_a = buffers.a.get(bl.mc * bl.kc_max + kPackSlack);
  // Partial sums of all but the last K block: in C itself where C is FP32 and its old values
  // are not needed (beta = 0), else in this thread's scratch for the block.
  bool in_c = false;
  if constexpr (std::is_same_v<TC, float>) in_c = finish.beta == 0.0f;
  float* partial = nullptr;
  if (!in_c && bl.k_blocks > 1) partial = buffers.partial.get(bl.mc * bl.nc);
  const int64_t ldp = in_c ? ldc : bl.nc;
  const auto partial_at = [&](int64_t row, int64_t col) -> float* {
    if constexpr (std::is_same_v<TC, float>) {
      if (in_c) return c + row * ldc + col;
    }
    return partial + (row - ic) * ldp + (col - jc);
  };

  const int64_t panels = ceil_div(nb, kNr), strips = ceil_div(mb, kMr);
  const BlockScales* scales = finish.scales;
  const bool in_blocks = scales != nullptr && scales->block_k < bl.k;
  for (int64_t kb = 0; kb < bl.k_blocks; ++kb) {
    const auto [k0, kc] = bl.k_range(kb);
    const bool last = kb == bl.k_blocks - 1;
    // The scale block k0 starts (k0 is on a boundary when K is in blocks).
    const int64_t scale_block = in_blocks ? k0 / scales->block_k : 0;
    for (int64_t s = 0; s < strips; ++s) {
      const int64_t i = ic + s * kMr;
      pack<kMr>(a, i, std::min(kMr, m - i), k0, kc, packed_a + s * kc * kMr);
    }
    for (int64_t q = 0; q < panels; ++q) {
      const int64_t col = jc + q * kNr;
      const int64_t cols = std::min(kNr, n - col);
      const float* panel = packed_b + (k0 * panels + q * kc) * kNr;
      for (int64_t s = 0; s < strips; ++s) {
        const int64_t row = ic + s * kMr;
        const int64_t rows = std::min(kMr, m - row);
        const float* strip = packed_a + s * kc * kMr;
        const float* init = kb == 0 ? nullptr : partial_at(row, col);
        const bool full = rows == kMr && cols == kNr;
        TileScales tile_scales{};
        if (scales != nullptr) {
          tile_scales = TileScales{scales->a + scale_block * scales->a_stride + row,
                                   scales->a_stride,
                                   scales->b + scale_block * scales->b_stride + col,
                                   scales->b_stride,
                                   scales->block_k,
                                   in_blocks};
        }
        const TileScales* ts = scales != nullptr ? &tile_scales : nullptr;
        if (!last) {
          float* dst = partial_at(row, col);
          if (full) {
            partial_tile(kc, strip, panel, init, ldp, dst, ldp, ts);
          } else {
            edge_tile(kc, strip, panel, init, ldp, dst, ldp, nullptr, ts, rows, cols);
          }
        } else if (full) {
          final_tile(kc, strip, panel, init, ldp, c + row * ldc + col, ldc, finish, ts);
        } else {
          edge_tile(kc, strip, panel, init, ldp, c + row * ldc + col, ldc, &finish, ts, rows, cols);
        }
      }
    }
  }
}

// C[m, n] (row stride ldc) = alpha * op(A) op(B) + beta * C on the calling thread alone,
// op(A) being a's m lines and op(B) b's n lines, K values each.
template <class TA, class TB, class TC>
void gemm_one_thread(const Lines<TA>& a, const Lines<TB>& b, int64_t m, int64_t n, int64_t k,
                     const Finish& finish, TC* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  const Blocking bl = make_blocking(m, n, k, kMc, k_unit(finish, k));
  float* packed_b = buffers_of_this_thread().b.get(bl.nc * k + kPackSlack);
  for (int64_t jc = 0; jc < n; jc += bl.nc) {
    const int64_t nb = std::min(bl.nc, n - jc), panels = ceil_div(nb, kNr);
    for (int64_t item = 0; item < bl.k_blocks * panels; ++item) {
      pack_b_item(b, bl, jc, panels, n, item, packed_b);
    }
    for (int64_t ic = 0; ic < m; ic += bl.mc) {
      row_block(a, bl, ic, std::min(bl.mc, m - ic), jc, nb, packed_b, finish, c, ldc, m, n);
    }
  }
}

// How many blocks of rows gemm_all_threads cuts C[m, ...] into: as many as a multiple of the
// thread count allows (none over kMc rows), the strips spread evenly over them (block counts
// that leave one thread a block more than the others cost that block's time at the end of
// every product, several percent of it at the model's shapes).
int64_t shared_row_blocks(int64_t m, int64_t threads) {
  const int64_t strips = ceil_div(m, kMr);
  return std::min(strips,
                  round_up(std::max(kRowBlocksPerThread * threads, ceil_div(m, kMc)), threads));
}

// The same on every OpenMP thread. Each column block of op(B) is packed once, into the calling
// thread's buffer, which all threads then share; the work is a queue of items that threads
// claim one at a time as they come free: first the B panels to pack, then the blocks of rows
// (at least kRowBlocksPerThread per thread). A block of rows starts once every B panel is
// packed. So a thread that the OS holds back (another process on its core) simply claims
// fewer items: nobody waits for it to arrive anywhere but at the end of the product, and a
// thread that never got to run leaves its share to the others.
// The blocks of rows are whole strips (shared_row_blocks).
template <class TA, class TB, class TC>
void gemm_all_threads(const Lines<TA>& a, const Lines<TB>& b, int64_t m, int64_t n, int64_t k,
                      const Finish& finish, TC* c, int64_t ldc, int64_t threads) {
  const int64_t strips = ceil_div(m, kMr);
  const int64_t row_blocks = shared_row_blocks(m, threads);
  // Block r is strips [strips r / row_blocks, strips (r + 1) / row_blocks).
  const auto block_start = [&](int64_t r) { return strips * r / row_blocks * kMr; };
  Blocking bl = make_blocking(m, n, k, kMc, k_unit(finish, k));
  bl.mc = ceil_div(strips, row_blocks) * kMr;  // the largest block, which sizes the buffers
  float* packed_b = buffers_of_this_thread().b.get(bl.nc * k + kPackSlack);
  for (int64_t jc = 0; jc < n; jc += bl.nc) {
    const int64_t nb = std::min(bl.nc, n - jc), panels = ceil_div(nb, kNr);
    const int64_t pack_items = bl.k_blocks * panels;
    std::atomic<int64_t> next_item{0}, packed{0};
#pragma omp parallel
    for (;;) {
      const int64_t item = next_item.fetch_add(1, std::memory_order_relaxed);
      if (item >= pack_items + row_blocks) break;
      if (item < pack_items) {
        pack_b_item(b, bl, jc, panels, n, item, packed_b);
        packed.fetch_add(1, std::memory_order_release);
        continue;
      }
      // Panels claimed by another thread may still be in the works; if that thread lost its
      // core, give the core up too rather than spin through the time slice.
      for (int spins = 0; packed.load(std::memory_order_acquire) < pack_items; ++spins) {
        if (spins < kSpinsBeforeYield) {
          _mm_pause();
        } else {
          std::this_thread::yield();
        }
      }
      const int64_t r = item - pack_items;
      const int64_t ic = block_start(r);
      const int64_t mb = std::min(block_start(r + 1), m) - ic;
      row_block(a, bl, ic, mb, jc, nb, packed_b, finish, c, ldc, m, n);
    }
  }
}

template <class TA, class TB, class TC>
void gemm_typed(const GemmShape& s, const TA* a, bool trans_a, const TB* b, bool trans_b,
                const Finish& finish, TC* c) {
  // op(A): rows of A [m, k], or columns of a transposed A [k, m]; op(B): columns of B
  // [k, n], or rows of a transposed B [n, k]. Product p's operands, or its columns from col0
  // on (a slice of op(B)).
  const int64_t lda = trans_a ? s.m : s.k, ldb = trans_b ? s.k : s.n;
  const auto a_lines = [&](int64_t p) {
    return Lines<TA>{a + p * s.m * s.k, trans_a, lda, trans_a ? s.m : 0};
  };
  const auto b_lines = [&](int64_t p, int64_t col0) {
    const TB* product = b + p * s.k * s.n;
    return Lines<TB>{product + (trans_b ? col0 * s.k : col0), !trans_b, ldb,
                     trans_b ? 0 : s.n - col0};
  };
  const auto c_of = [&](int64_t p) { return c + p * s.m * s.n; };

  const int64_t threads = omp_get_max_threads();
  const double flops = 2.0 * static_cast<double>(s.batch * s.m) * static_cast<double>(s.n * s.k);
  if (threads == 1 || flops < kGemmParallelFlops) {
    for (int64_t p = 0; p < s.batch; ++p) {
      gemm_one_thread(a_lines(p), b_lines(p, 0), s.m, s.n, s.k, finish, c_of(p), s.n);
    }
  } else if (s.batch % threads == 0) {
    // Whole products, the same number per thread.
#pragma omp parallel for schedule(static)
    for (int64_t p = 0; p < s.batch; ++p) {
      gemm_one_thread(a_lines(p), b_lines(p, 0), s.m, s.n, s.k, finish, c_of(p), s.n);
    }
  } else if ((s.m >= threads * kMinSlice || s.m >= s.n) &&
             (ceil_div(s.m, shared_row_blocks(s.m, threads)) * 2 >= kMc ||
              s.n < threads * kMinSlice)) {
    // Blocks of rows large enough that each packed B panel serves many strips from L1. Below
    // half an A block (a weight gradient's 384 rows cut in 8 blocks of 48: 0.84x sgemm at 2
    // threads) the column slices below do better (0.97x): each thread packs only its columns
    // and runs its rows in A blocks of up to kMc.
    for (int64_t p = 0; p < s.batch; ++p) {
      gemm_all_threads(a_lines(p), b_lines(p, 0), s.m, s.n, s.k, finish, c_of(p), s.n, threads);
    }
  } else {
    // C has too few rows to share out in large blocks: each thread takes a slice of the
    // columns (of whole micro-tiles), none thinner than kMinSlice.
    const int64_t parts = std::clamp<int64_t>(threads, 1, std::max<int64_t>(1, s.n / kMinSlice));
#pragma omp parallel for schedule(static)
    for (int64_t slice = 0; slice < s.batch * parts; ++slice) {
      const int64_t p = slice / parts, part = slice % parts;
      const int64_t lo = part * s.n / parts / kNr * kNr;
      const int64_t hi = part + 1 == parts ? s.n : (part + 1) * s.n / parts / kNr * kNr;
      // The slice's column scales start at its first column.
      BlockScales slice_scales{};
      Finish slice_finish = finish;
      if (finish.scales != nullptr) {
        slice_scales = *finish.scales;
        slice_scales.b += lo;
        slice_finish.scales = &slice_scales;
      }
      gemm_one_thread(a_lines(p), b_lines(p, lo), s.m, hi - lo, s.k, slice_finish, c_of(p) + lo,
                      s.n);
    }
  }
}

// C = beta * C (0 when beta is 0: C is not read), what a GEMM with alpha = 0 or K = 0 leaves.
template <class TC>
void scale_only(int64_t n, float beta, TC* c) {
  for (int64_t i = 0; i < n; ++i) c[i] = round_to<TC>(beta == 0.0f ? 0.0f : beta * to_float(c[i]));
}

// B's type for an A of type TA: the same type, or either FP8 type for an FP8 A (only the
// pairs avx2_gemm_supports names are instantiated).
template <class TA, class TC>
void gemm_with_a(const GemmShape& s, const TA* a, bool trans_a, const Tensor& b, bool trans_b,
                 const Finish& finish, TC* c) {
  constexpr bool fp8_a = std::is_same_v<TA, fp8_e4m3> || std::is_same_v<TA, fp8_e5m2>;
  if constexpr (fp8_a) {
    if (b.dtype() == DType::kE4M3) {
      return gemm_typed(s, a, trans_a, b.data_as<const fp8_e4m3>(), trans_b, finish, c);
    }
    return gemm_typed(s, a, trans_a, b.data_as<const fp8_e5m2>(), trans_b, finish, c);
  } else {
    return gemm_typed(s, a, trans_a, b.data_as<const TA>(), trans_b, finish, c);
  }
}

template <class TC>
void gemm_any(const GemmShape& s, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
              float alpha, float beta, TC* c, const BlockScales* scales) {
  if (s.batch * s.m * s.n == 0) return;
  if (alpha == 0.0f || s.k == 0) return scale_only(s.batch * s.m * s.n, beta, c);
  const Finish finish{alpha, beta, scales};
  switch (a.dtype()) {
    case DType::kF32:
      return gemm_with_a(s, a.data_as<const float>(), trans_a, b, trans_b, finish, c);
    case DType::kBF16:
      return gemm_with_a(s, a.data_as<const bf16>(), trans_a, b, trans_b, finish, c);
    case DType::kF16:
      return gemm_with_a(s, a.data_as<const fp16>(), trans_a, b, trans_b, finish, c);
    case DType::kE4M3:
      return gemm_with_a(s, a.data_as<const fp8_e4m3>(), trans_a, b, trans_b, finish, c);
    case DType::kE5M2:
      return gemm_with_a(s, a.data_as<const fp8_e5m2>(), trans_a, b, trans_b, finish, c);
    default: MANTISSA_FAIL("gemm_avx2: A is " << a.describe() << ", not a float dtype");
  }
}

}  // namespace

bool avx2_gemm_supports(DType a, DType b) {
  return ((a == DType::kF32 || a == DType::kBF16 || a == DType::kF16) && a == b) ||
         (is_fp8(a) && is_fp8(b));
}

void gemm_avx2(const GemmShape& s, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
               float alpha, float beta, void* c, DType c_dtype, const BlockScales* scales) {
  MANTISSA_CHECK(avx2_gemm_supports(a.dtype(), b.dtype()) &&
                     (c_dtype == DType::kF32 || c_dtype == DType::kBF16),
                 "gemm_avx2: called for A " << a.describe() << ", B " << b.describe() << ", C "
                                            << dtype_name(c_dtype)
                                            << ", a combination it does not take");
  MANTISSA_CHECK(scales == nullptr || (s.batch == 1 && scales->block_k > 0),
                 "gemm_avx2: block scales need one product and a positive block_k, not batch "
                     << s.batch << " with block_k " << (scales ? scales->block_k : 0));
  if (c_dtype == DType::kF32)
    return gemm_any(s, a, trans_a, b, trans_b, alpha, beta, static_cast<float*>(c), scales);
  gemm_any(s, a, trans_a, b, trans_b, alpha, beta, static_cast<bf16*>(c), scales);
}

}  // namespace mantissa::core
