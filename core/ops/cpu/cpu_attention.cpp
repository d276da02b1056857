// Causal self-attention on the CPU as one fused kernel: the function of core/ops/attention.h's
// composed routine (which the CUDA backend runs), computed per head in FP32 scratch, about
// three times faster on the CPU than the routine's batched GEMMs over full T x T matrices
// (bench_attention cpu). The softmax pieces are core/ops/math/softmax.h's; operands are read
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

#include "core/ops/attention.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_convert8.h"
#include "core/ops/cpu/cpu_exp8.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

namespace {

// Two 8-lane FP32 vectors make one 16-column tile row (GCC/Clang vector extension; with
// -march=x86-64-v3 each is one AVX2 register and `acc += a * b` one FMA).
typedef float f32x8 __attribute__((vector_size(32)));
constexpr int64_t kTileRows = 4;
constexpr int64_t kTileCols = 16;

f32x8 load8(const float* p) {
  f32x8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

void store8(float* p, f32x8 v) {
  std::memcpy(p, &v, sizeof v);
}

int64_t round_up(int64_t n, int64_t m) {
  return (n + m - 1) / m * m;
}

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

// c[r, 0..cols) = sum_k A(i0 + r, k) B(k, 0..cols) for the rows r < rows (at most
// kTileRows), with B(k, j) = b[k * ldb + j]; cols is rounded up to whole tiles, so b and c
// must be padded to a multiple of kTileCols columns.
//
// A tile holds 4 x 16 accumulators in eight registers; each step over k loads two vectors of
// B, broadcasts four values of A and issues eight independent FMAs. The k shared by all
// rows of the tile run through that loop; the few that differ at a triangle's edge run row
// by row. Either way every element sums its k in increasing order.
void product_rows(const Matrix& a, const float* b, int64_t ldb, int64_t cols, int64_t i0,
                  int64_t rows, Range range, int64_t k_limit, float* c, int64_t ldc) {
  int64_t begin[kTileRows], end[kTileRows];
  for (int64_t r = 0; r < kTileRows; ++r) {
    const int64_t i = i0 + r;
    begin[r] = r >= rows ? 0 : range == Range::kFromRow ? i : 0;
    end[r] = r >= rows ? 0 : range == Range::kUpToRow ? i + 1 : k_limit;
  }
  const int64_t shared_begin = *std::max_element(begin, begin + kTileRows);
  const int64_t shared_end = std::max(shared_begin, *std::min_element(end, end + kTileRows));

  for (int64_t j0 = 0; j0 < cols; j0 += kTileCols) {
    f32x8 lo[kTileRows] = {}, hi[kTileRows] = {};
    auto one_row = [&](int64_t r, int64_t k0, int64_t k1) {
      for (int64_t k = k0; k < k1; ++k) {
        const float ar = a.at(i0 + r, k);
        lo[r] += ar * load8(b + k * ldb + j0);
        hi[r] += ar * load8(b + k * ldb + j0 + 8);
      }
    };
    for (int64_t r = 0; r < rows; ++r) one_row(r, begin[r], std::min(shared_begin, end[r]));
    for (int64_t k = shared_begin; k < shared_end; ++k) {
      const f32x8 b_lo = load8(b + k * ldb + j0);
      const f32x8 b_hi = load8(b + k * ldb + j0 + 8);
      for (int64_t r = 0; r < kTileRows; ++r) {
        const float ar = a.at(i0 + r, k);
        lo[r] += ar * b_lo;
        hi[r] += ar * b_hi;
      }
    }
    for (int64_t r = 0; r < rows; ++r) one_row(r, std::max(shared_end, begin[r]), end[r]);
    for (int64_t r = 0; r < rows; ++r) {
      store8(c + r * ldc + j0, lo[r]);
      store8(c + r * ldc + j0 + 8, hi[r]);
    }
  }
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

// Loads the (b, h) slice of qkv [B, T, 3C] into padded FP32 scratch through the slots for Q,
// K and V; the transposed ones go through `row`, D floats of temporary space.
void load_qkv(const Tensor& qkv, int64_t b, int64_t h, int64_t T, int64_t C, int64_t D,
              const Slot (&slots)[3], float* row) {
  for (int64_t t = 0; t < T; ++t) {
    const int64_t base = (b * T + t) * 3 * C + h * D;
    for (int64_t i = 0; i < 3; ++i) {
      const Slot& slot = slots[i];
      float* dst = slot.data + t * slot.t_stride;
      if (slot.d_stride == 1) {
        load(qkv, base + i * C, D, dst);
      } else {
        load(qkv, base + i * C, D, row);
        for (int64_t d = 0; d < D; ++d) dst[d * slot.d_stride] = row[d];
      }
    }
  }
}

}  // namespace

void CpuBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& att, int n_head) {
  const auto [B, T, C, H, D] = check_attention_forward(qkv, out, att, n_head, device());

  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const DType score_dtype = attention_score_dtype(qkv.dtype(), att.dtype());
  const int64_t Tp = round_up(T, kTileCols), Dp = round_up(D, kTileCols);
#pragma omp parallel
  {
    // q[T, D], kt[D, T] (K transposed), v[T, D], s[T, T] (scores, then probabilities) and
    // o[kTileRows, D], with rows and columns padded to whole tiles.
    std::vector<float> scratch(static_cast<size_t>(3 * Tp * Dp + Tp * Tp + kTileRows * Dp));
    float* q = scratch.data();
    float* kt = q + Tp * Dp;
    float* v = kt + Dp * Tp;
    float* s = v + Tp * Dp;
    float* o = s + Tp * Tp;
#pragma omp for collapse(2) schedule(static)
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < H; ++h) {
        load_qkv(qkv, b, h, T, C, D, {{q, Dp, 1}, {kt, 1, Tp}, {v, Dp, 1}}, o);
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
          float max_score = -INFINITY;
          for (int64_t t2 = 0; t2 < n; ++t2) {
            p[t2] *= scale;
            max_score = softmax_max(max_score, p[t2]);
          }
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

  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const DType grad_dtype = attention_score_grad_dtype(qkv.dtype(), dout.dtype());
  const int64_t Tp = round_up(T, kTileCols), Dp = round_up(D, kTileCols);
#pragma omp parallel
  {
    // q, k, dy (dout) [T, D], vt[D, T] (V transposed), p and ds [T, T], and one block of
    // output rows g[kTileRows, D], padded to whole tiles.
    std::vector<float> scratch(static_cast<size_t>(4 * Tp * Dp + 2 * Tp * Tp + kTileRows * Dp));
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
        load_qkv(qkv, b, h, T, C, D, {{q, Dp, 1}, {k, Dp, 1}, {vt, 1, Tp}}, g);
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
          float p_dp = 0.0f;
          for (int64_t t2 = 0; t2 <= t; ++t2) p_dp += p_t[t2] * ds_t[t2];
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
