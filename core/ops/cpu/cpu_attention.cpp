// Causal self-attention on the CPU as one fused kernel: the function of core/ops/attention.h's
// composed routine (which the CUDA backend runs), computed per head in FP32 scratch, faster on
// the CPU than the routine's batched GEMMs over full T x T matrices wherever those run on FP32
// FMAs (bench_attention cpu; on AMX tiles the routine's BF16 GEMMs are about 1.1x faster than
// this kernel). The softmax pieces are core/ops/math/softmax.h's; operands are read
// and written as cpu_layer_io.h describes.
//
// One (batch, head) pair per task. With P = att[b, h] (T x T), and
// Q, K, V, dO the head's [T, D] slices of qkv and dout, the forward is
//   S = Q K^T,  P = softmax(scale S) row-wise over t2 <= t (scale = 1 / sqrt(D)),  O = P V
// and the backward
//   dP = dO V^T,  dS = P * (dP - rowsum(P * dP)) * scale  (the softmax Jacobian, O(T) per row),
//   dV = P^T dO,  dQ = dS K,  dK = dS^T Q.
// S, P, dP and dS are rounded where the composed routine stores them (attention.h: S and
// dP, dS to BF16 in a BF16 step, P to att's dtype), so the two compute the same function up
// to the order of the FP32 sums, and the CPU trains as the GPU does.
// Each task gathers its head into contiguous, zero-padded FP32 scratch and computes these
// small products in register tiles (below); only entries on or below the diagonal
// (t2 <= t) are ever read, so a non-finite value in a future position stays in the future.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/int_math.h"
#include "core/ops/attention.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_convert8.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/cpu/cpu_narrow_avx512.h"
#include "core/ops/cpu/cpu_row_dot.h"
#include "core/ops/cpu/cpu_softmax_rows.h"
#include "core/ops/cpu/cpu_transpose8.h"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

namespace {

// Tiles of kTileRows rows and kTileCols (AVX2) or 2 kTileCols (AVX-512) columns, held in
// GCC/Clang vector-extension registers: with -march=x86-64-v3 an f32x8 is one AVX2 register,
// in an AVX-512 function an f32x16 one ZMM register, and `acc += a * b` one FMA.
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x16 __attribute__((vector_size(64)));
constexpr int64_t kTileRows = 4;
constexpr int64_t kTileCols = 16;  // the column padding of every operand and product

// A matrix read as A(i, k) = data[i * row_stride + k * k_stride]: a plain row-major matrix
// (k_stride 1) or the transpose of one (row_stride 1).
struct Matrix {
  const float* data;
  int64_t row_stride, k_stride;
  float at(int64_t i, int64_t k) const { return data[i * row_stride + k * k_stride]; }
};

// Which k a row i of the product sums over: all of [0, k_limit), the causal k <= i, or
// k >= i (the transposed causal products dV and dK).
enum class Range { kAll, kUpToRow, kFromRow };

// The k each row of a tile sums over, [begin[r], end[r]), and the part all rows share.
struct TileRanges {
  int64_t begin[kTileRows], end[kTileRows], shared_begin, shared_end;

  TileRanges(int64_t i0, int64_t rows, Range range, int64_t k_limit) {
    for (int64_t r = 0; r < kTileRows; ++r) {
      const int64_t i = i0 + r;
      begin[r] = r >= rows ? 0 : range == Range::kFromRow ? i : 0;
      end[r] = r >= rows ? 0 : range == Range::kUpToRow ? i + 1 : k_limit;
    }
    shared_begin = *std::max_element(begin, begin + kTileRows);
    shared_end = std::max(shared_begin, *std::min_element(end, end + kTileRows));
  }
};

// Columns [j0, j0 + kVectors lanes(V)) of product_rows' c, in kTileRows x kVectors registers
// of type V. Each step over k loads kVectors vectors of B, broadcasts four values of A and
// issues 4 kVectors independent FMAs. The k shared by all rows of the tile run through that
// loop; the few that differ at a triangle's edge run row by row. Either way every element is
// one chain of FMAs over its k in increasing order, whatever the vector width, so the AVX2
// and AVX-512 tiles give the same bits.
template <class V, int kVectors>
[[gnu::always_inline]] inline void product_tile(const Matrix& a, const float* b, int64_t ldb,
                                                int64_t j0, int64_t i0, int64_t rows,
                                                const TileRanges& ranges, float* c, int64_t ldc) {
  constexpr int64_t kLanes = sizeof(V) / sizeof(float);
  V acc[kTileRows][kVectors] = {};
  const auto add_row_step = [&](int64_t r, int64_t k) {
    const float ar = a.at(i0 + r, k);
    for (int v = 0; v < kVectors; ++v) {
      V bv;
      std::memcpy(&bv, b + k * ldb + j0 + v * kLanes, sizeof bv);
      acc[r][v] += ar * bv;
    }
  };
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = ranges.begin[r]; k < std::min(ranges.shared_begin, ranges.end[r]); ++k) {
      add_row_step(r, k);
    }
  }
  for (int64_t k = ranges.shared_begin; k < ranges.shared_end; ++k) {
    V bv[kVectors];
    for (int v = 0; v < kVectors; ++v)
      std::memcpy(&bv[v], b + k * ldb + j0 + v * kLanes, sizeof(V));
    for (int64_t r = 0; r < kTileRows; ++r) {
      const float ar = a.at(i0 + r, k);
      for (int v = 0; v < kVectors; ++v) acc[r][v] += ar * bv[v];
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k = std::max(ranges.shared_end, ranges.begin[r]); k < ranges.end[r]; ++k) {
      add_row_step(r, k);
    }
  }
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(c + r * ldc + j0, &acc[r][0], sizeof acc[r]);
  }
}

void product_rows_avx2(const Matrix& a, const float* b, int64_t ldb, int64_t cols, int64_t i0,
                       int64_t rows, const TileRanges& ranges, float* c, int64_t ldc) {
  for (int64_t j0 = 0; j0 < cols; j0 += kTileCols) {
    product_tile<f32x8, 2>(a, b, ldb, j0, i0, rows, ranges, c, ldc);
  }
}

// Twice the columns per FMA, and twice per tile where two kTileCols fit.
[[gnu::target("avx512f")]] void product_rows_avx512(const Matrix& a, const float* b, int64_t ldb,
                                                    int64_t cols, int64_t i0, int64_t rows,
                                                    const TileRanges& ranges, float* c,
                                                    int64_t ldc) {
  const int64_t padded = round_up(cols, kTileCols);
  int64_t j0 = 0;
  for (; j0 + 2 * kTileCols <= padded; j0 += 2 * kTileCols) {
    product_tile<f32x16, 2>(a, b, ldb, j0, i0, rows, ranges, c, ldc);
  }
  if (j0 < padded) product_tile<f32x16, 1>(a, b, ldb, j0, i0, rows, ranges, c, ldc);
}

// c[r, 0..cols) = sum_k A(i0 + r, k) B(k, 0..cols) for the rows r < rows (at most
// kTileRows), with B(k, j) = b[k * ldb + j], summed over `range`; cols is rounded up to whole
// kTileCols, so b and c must be padded to a multiple of kTileCols columns.
void product_rows(const Matrix& a, const float* b, int64_t ldb, int64_t cols, int64_t i0,
                  int64_t rows, Range range, int64_t k_limit, float* c, int64_t ldc) {
  const TileRanges ranges(i0, rows, range, k_limit);
  if (avx512::narrow_enabled()) {
    return product_rows_avx512(a, b, ldb, cols, i0, rows, ranges, c, ldc);
  }
  product_rows_avx2(a, b, ldb, cols, i0, rows, ranges, c, ldc);
}

// x[0, n) rounded to `dtype` and widened back: the value the composed routine would store
// there (nothing changes for F32). BF16 runs eight lanes at a time: bf16_round8 is
// bf16_from_float lane by lane, and a code shifted into the top half of a lane is its FP32
// value, so every element gets exactly bf16_to_float(round_to<bf16>(x)).
void round_through(float* x, int64_t n, DType dtype) {
  if (dtype == DType::kBF16) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256i codes = bf16_round8(_mm256_loadu_ps(x + i));
      _mm256_storeu_ps(x + i, _mm256_castsi256_ps(_mm256_slli_epi32(codes, 16)));
    }
    for (; i < n; ++i) x[i] = bf16_to_float(round_to<bf16>(x[i]));
  } else if (dtype == DType::kF16) {
    for (int64_t i = 0; i < n; ++i) x[i] = fp16_to_float(round_to<fp16>(x[i]));
  }
}

// Where load_qkv puts one of Q, K and V: element (t, d) at data[t * t_stride + d * d_stride],
// so a padded [T, Dp] row-major block (d_stride 1) or its [D, Tp] transpose (t_stride 1).
struct Slot {
  float* data;
  int64_t t_stride, d_stride;
};

// Rows a transposed slot of load_qkv takes at a time: one 8 x 8 register transpose's.
constexpr int64_t kTransposeRows = 8;
// How far ahead of its reads load_qkv asks for rows.
constexpr int64_t kPrefetchRows = 8;
// Rows of the scratch block that holds a tile of output rows, and load_qkv's rows before.
constexpr int64_t kRowsScratch = std::max(kTileRows, kTransposeRows);

// Loads the (b, h) slice of qkv [B, T, 3C] into padded FP32 scratch through the slots for Q,
// K and V. A transposed slot takes kTransposeRows rows at a time into `rows` (that many rows
// of Dp floats) and turns them into columns by 8 x 8 register transposes, so that each store
// is eight contiguous floats instead of one float on a line of its own.
void load_qkv(const Tensor& qkv, int64_t b, int64_t h, int64_t T, int64_t C, int64_t D, int64_t Dp,
              const Slot (&slots)[3], float* rows) {
  const auto offset = [&](int64_t t, int64_t i) { return (b * T + t) * 3 * C + i * C + h * D; };
  // A head's rows lie 3C elements apart, too far for the hardware prefetchers to run ahead:
  // each row is asked for kPrefetchRows rows before it is read.
  const size_t element = dtype_size(qkv.dtype());
  const auto* bytes = static_cast<const char*>(qkv.data());
  const auto load_row = [&](int64_t t, int64_t i, float* dst) {
    if (t + kPrefetchRows < T) {
      const char* ahead = bytes + offset(t + kPrefetchRows, i) * element;
      for (size_t at = 0; at < D * element; at += 64) _mm_prefetch(ahead + at, _MM_HINT_T0);
    }
    load(qkv, offset(t, i), D, dst);
  };
  for (int64_t i = 0; i < 3; ++i) {
    const Slot& slot = slots[i];
    if (slot.d_stride == 1) {
      for (int64_t t = 0; t < T; ++t) load_row(t, i, slot.data + t * slot.t_stride);
      continue;
    }
    for (int64_t t0 = 0; t0 < T; t0 += kTransposeRows) {
      const int64_t n = std::min(kTransposeRows, T - t0);
      for (int64_t r = 0; r < n; ++r) load_row(t0 + r, i, rows + r * Dp);
      int64_t d0 = 0;
      for (; n == kTransposeRows && d0 + 8 <= D; d0 += 8) {
        __m256 block[8];
        for (int r = 0; r < 8; ++r) block[r] = _mm256_loadu_ps(rows + r * Dp + d0);
        transpose8(block);
        for (int j = 0; j < 8; ++j) {
          _mm256_storeu_ps(slot.data + (d0 + j) * slot.d_stride + t0, block[j]);
        }
      }
      for (int64_t d = d0; d < D; ++d) {
        for (int64_t r = 0; r < n; ++r) slot.data[d * slot.d_stride + t0 + r] = rows[r * Dp + d];
      }
    }
  }
}

}  // namespace

void CpuBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& att, int n_head) {
  const auto [B, T, C, H, D] = check_attention_forward(qkv, out, att, n_head, device());

  const float scale = attention_scale(D);
  const DType score_dtype = attention_score_dtype(qkv.dtype(), att.dtype());
  const int64_t Tp = round_up(T, kTileCols), Dp = round_up(D, kTileCols);
#pragma omp parallel
  {
    // q[T, D], kt[D, T] (K transposed), v[T, D], s[T, T] (scores, then probabilities) and
    // o[kTileRows, D] (first load_qkv's rows), with rows and columns padded to whole tiles.
    std::vector<float> scratch(static_cast<size_t>(3 * Tp * Dp + Tp * Tp + kRowsScratch * Dp));
    float* q = scratch.data();
    float* kt = q + Tp * Dp;
    float* v = kt + Dp * Tp;
    float* s = v + Tp * Dp;
    float* o = s + Tp * Tp;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        load_qkv(qkv, b, h, T, C, D, Dp, {{q, Dp, 1}, {kt, 1, Tp}, {v, Dp, 1}}, o);
        // Scores for each block of query rows, up to the block's last visible key.
        for (int64_t t0 = 0; t0 < T; t0 += kTileRows) {
          const int64_t rows = std::min(kTileRows, T - t0);
          product_rows({q, Dp, 1}, kt, Tp, t0 + rows, t0, rows, Range::kAll, D, s + t0 * Tp, Tp);
        }
        for (int64_t t = 0; t < T; ++t) {
          // Softmax in FP32, shifted by the maximum so that exp never overflows. A NaN score
          // never wins the comparison but still turns the sum, hence the row, into NaN.
          float* p = s + t * Tp;
          const int64_t n = t + 1;  // visible keys
          round_through(p, n, score_dtype);
          for (int64_t t2 = 0; t2 < n; ++t2) p[t2] *= scale;
          const float max_score = softmax_row_max(p, n);
          softmax_exp_row(p, n, max_score);
          const float sum = softmax_row_sum(p, n);
          const float inv_sum = 1.0f / sum;
          for (int64_t t2 = 0; t2 < n; ++t2) p[t2] *= inv_sum;
          // The saved row holds zeros past the diagonal; the output below and the backward
          // use the probabilities as saved.
          std::fill(p + n, p + T, 0.0f);
          store(p, T, att, ((b * H + h) * T + t) * T);
          round_through(p, n, att.dtype());
        }
        for (int64_t t0 = 0; t0 < T; t0 += kTileRows) {
          const int64_t rows = std::min(kTileRows, T - t0);
          product_rows({s, Tp, 1}, v, Dp, D, t0, rows, Range::kUpToRow, T, o, Dp);
          for (int64_t r = 0; r < rows; ++r) {
            store(o + r * Dp, D, out, (b * T + t0 + r) * C + h * D);
          }
        }
      }
    }
  }
}

void CpuBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att,
                                    Tensor& dqkv, int n_head) {
  const auto [B, T, C, H, D] = check_attention_backward(dout, qkv, att, dqkv, n_head, device());

  const float scale = attention_scale(D);
  const DType grad_dtype = attention_score_grad_dtype(qkv.dtype(), dout.dtype());
  const int64_t Tp = round_up(T, kTileCols), Dp = round_up(D, kTileCols);
#pragma omp parallel
  {
    // q, k, dy (dout) [T, D], vt[D, T] (V transposed), p and ds [T, T], and one block of
    // output rows g[kTileRows, D] (first load_qkv's rows), padded to whole tiles.
    std::vector<float> scratch(static_cast<size_t>(4 * Tp * Dp + 2 * Tp * Tp + kRowsScratch * Dp));
    float* q = scratch.data();
    float* k = q + Tp * Dp;
    float* dy = k + Tp * Dp;
    float* vt = dy + Tp * Dp;
    float* p = vt + Dp * Tp;
    float* ds = p + Tp * Tp;
    float* g = ds + Tp * Tp;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        load_qkv(qkv, b, h, T, C, D, Dp, {{q, Dp, 1}, {k, Dp, 1}, {vt, 1, Tp}}, g);
        for (int64_t t = 0; t < T; ++t) {
          load(dout, (b * T + t) * C + h * D, D, dy + t * Dp);
          load(att, ((b * H + h) * T + t) * T, t + 1, p + t * Tp);
        }
        // dP = dO V^T on and below the diagonal, then dS row by row in place.
        for (int64_t t0 = 0; t0 < T; t0 += kTileRows) {
          const int64_t rows = std::min(kTileRows, T - t0);
          product_rows({dy, Dp, 1}, vt, Tp, t0 + rows, t0, rows, Range::kAll, D, ds + t0 * Tp, Tp);
        }
        for (int64_t t = 0; t < T; ++t) {
          const float* p_t = p + t * Tp;
          float* ds_t = ds + t * Tp;
          round_through(ds_t, t + 1, grad_dtype);
          const float p_dp = row_dot(p_t, ds_t, t + 1);
          for (int64_t t2 = 0; t2 <= t; ++t2) {
            ds_t[t2] = softmax_backward(p_t[t2], ds_t[t2], p_dp) * scale;
          }
          round_through(ds_t, t + 1, grad_dtype);
        }
        // dQ rows are query positions (k <= row); dK and dV rows are key positions, which
        // receive from the queries at or after them (k >= row).
        for (int64_t t0 = 0; t0 < T; t0 += kTileRows) {
          const int64_t rows = std::min(kTileRows, T - t0);
          const int64_t base = (b * T + t0) * 3 * C + h * D;
          product_rows({ds, Tp, 1}, k, Dp, D, t0, rows, Range::kUpToRow, T, g, Dp);
          for (int64_t r = 0; r < rows; ++r) store(g + r * Dp, D, dqkv, base + r * 3 * C);
          product_rows({ds, 1, Tp}, q, Dp, D, t0, rows, Range::kFromRow, T, g, Dp);
          for (int64_t r = 0; r < rows; ++r) store(g + r * Dp, D, dqkv, base + r * 3 * C + C);
          product_rows({p, 1, Tp}, dy, Dp, D, t0, rows, Range::kFromRow, T, g, Dp);
          for (int64_t r = 0; r < rows; ++r) store(g + r * Dp, D, dqkv, base + r * 3 * C + 2 * C);
        }
      }
    }
  }
}

}  // namespace mantissa::core
