// Flash attention on the GPU (Backend::flash_attention_forward and _backward): FlashAttention-2
// (Dao, 2023) on tensor cores through WMMA, BF16 or F16 operands with FP32 accumulation and
// softmax. The CPU twin, and the reference the GPU tests hold these kernels to, is
// cpu_flash_attention.cpp; the softmax pieces are core/ops/math/softmax.h's.
//
// Why: the composed routine (core/ops/attention.h) writes and reads [B, H, T, T] scores,
// probabilities and their gradients, about 53 GB of DRAM traffic per GPT-2 124M step at
// T = 1024, B = 16 (at least 15 ms on an H200). These kernels keep every T x T tile in shared
// memory and move only Q, K, V, dout, out, lse and dqkv through DRAM.
//
// Tiles of kTile = 64 query rows and 64 keys; a block of 4 warps, each owning 16 rows of its
// block's tile (one WMMA m). Per warp, products go through shared memory: scores land in
// FP32 [16][64], the softmax runs on them with two lanes per row, probabilities are rounded
// to the operand dtype for the next product, and the [16][D] FP32 accumulators live in shared
// memory too (so the forward can rescale a row when its running maximum grows). That costs
// some speed against register-resident accumulators but keeps every kernel readable.
//
// Forward (one block per head and query tile, key tiles up to the diagonal):
//   S = Q K^T,  m' = max(m, rowmax(scale S)),  P = exp(scale S - m'),
//   l = l exp(m - m') + rowsum(P),  O = O exp(m - m') + P V;  finally out = O / l and
//   lse = m + log l.
// Backward, deterministic (no atomics): delta = rowsum(dout * out) first; then one kernel per
// key tile accumulates dK and dV over the query tiles at or after it, and a second per query
// tile accumulates dQ over the key tiles up to it, each recomputing P = exp(scale S - lse)
// and dS = scale P (dP - delta) with dP = dout V^T. The second kernel repeats two of the
// first's products (S and dP), about 30% more backward FLOPs than FlashAttention-2's atomic
// dQ, for bit-reproducible gradients.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <string>
#include <type_traits>

#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;
namespace wmma = nvcuda::wmma;

constexpr int kTile = 64;              // query rows, and keys, per tile
constexpr int kFrag = 16;              // WMMA m = n = k
constexpr int kWarps = kTile / kFrag;  // each warp owns 16 rows of a tile
constexpr int kThreads = kWarps * kWarpSize;
// Shared row strides, in elements. Padding shifts consecutive rows across banks; every WMMA
// pointer stays 32-byte aligned (16 rows of any of these strides are a multiple of 32 bytes)
// and every ldm a multiple of 8 (16-bit) or 4 (FP32) elements, as WMMA requires.
template <int D>
constexpr int kOperandStride = D + 8;    // [kTile][D] tiles of Q, K, V, dout (16-bit)
constexpr int kScoreStride = kTile + 4;  // [16][kTile] FP32 scores per warp
constexpr int kProbStride = kTile + 8;   // [16][kTile] 16-bit probabilities per warp
template <int D>
constexpr int kAccStride = D + 4;  // [16][D] FP32 accumulators per warp

template <class T>
struct WmmaType;
template <>
struct WmmaType<bf16> {
  using type = __nv_bfloat16;
};
template <>
struct WmmaType<fp16> {
  using type = __half;
};

// Consecutive 128-byte-aligned regions of a kernel's dynamic shared memory. The same
// sequence of take() calls sizes the memory on the host (no base: the regions are null) and
// carves it on the device. The regions are pointer offsets from the shared array, never
// integers: through an integer the compiler loses the shared state space and emits generic
// loads and stores (and generic WMMA fragment loads) for every tile access.
class SharedRegions {
 public:
  __host__ __device__ explicit SharedRegions(unsigned char* base) : base_(base) {}
  template <class U>
  __host__ __device__ U* take(int64_t count) {
    U* region = base_ ? reinterpret_cast<U*>(base_ + used_) : nullptr;
    used_ += (static_cast<size_t>(count) * sizeof(U) + 127) / 128 * 128;
    return region;
  }
  __host__ __device__ size_t bytes() const { return used_; }

 private:
  unsigned char* base_;
  size_t used_ = 0;
};

template <int D, class T>
struct ForwardShared {
  T *q, *k, *v, *probs;
  float *scores, *out;
  __host__ __device__ explicit ForwardShared(SharedRegions& r) {
    q = r.take<T>(kTile * kOperandStride<D>);
    k = r.take<T>(kTile * kOperandStride<D>);
    v = r.take<T>(kTile * kOperandStride<D>);
    scores = r.take<float>(kTile * kScoreStride);
    probs = r.take<T>(kTile * kProbStride);
    out = r.take<float>(kTile * kAccStride<D>);
  }
};

template <int D, class T>
struct KeyGradShared {
  T *k, *v, *q, *dout, *probs, *dscores;
  float *scores, *dprobs, *dk, *dv, *lse, *delta;
  __host__ __device__ explicit KeyGradShared(SharedRegions& r) {
    k = r.take<T>(kTile * kOperandStride<D>);
    v = r.take<T>(kTile * kOperandStride<D>);
    q = r.take<T>(kTile * kOperandStride<D>);
    dout = r.take<T>(kTile * kOperandStride<D>);
    scores = r.take<float>(kTile * kScoreStride);
    dprobs = r.take<float>(kTile * kScoreStride);
    probs = r.take<T>(kTile * kProbStride);
    dscores = r.take<T>(kTile * kProbStride);
    dk = r.take<float>(kTile * kAccStride<D>);
    dv = r.take<float>(kTile * kAccStride<D>);
    lse = r.take<float>(kTile);
    delta = r.take<float>(kTile);
  }
};

template <int D, class T>
struct QueryGradShared {
  T *q, *dout, *k, *v, *dscores;
  float *scores, *dprobs, *dq, *lse, *delta;
  __host__ __device__ explicit QueryGradShared(SharedRegions& r) {
    q = r.take<T>(kTile * kOperandStride<D>);
    dout = r.take<T>(kTile * kOperandStride<D>);
    k = r.take<T>(kTile * kOperandStride<D>);
    v = r.take<T>(kTile * kOperandStride<D>);
    scores = r.take<float>(kTile * kScoreStride);
    dprobs = r.take<float>(kTile * kScoreStride);
    dscores = r.take<T>(kTile * kProbStride);
    dq = r.take<float>(kTile * kAccStride<D>);
    lse = r.take<float>(kTile);
    delta = r.take<float>(kTile);
  }
};

template <class Shared>
size_t shared_bytes() {
  SharedRegions regions(nullptr);
  Shared layout(regions);
  return regions.bytes();
}

// Rows [row0, row0 + kTile) of one head's D channels into a shared [kTile][D] tile, 16 bytes
// per access; `rows` points at row 0's first channel of the head, `stride` elements apart.
// Rows at or past T are zero, so products with them add nothing (and no NaN).
template <int D, class T>
__device__ void load_tile(T* tile, const T* rows, int64_t stride, int64_t row0, int64_t T_) {
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  for (int i = threadIdx.x; i < kTile * kChunks; i += kThreads) {
    const int r = i / kChunks, c = (i % kChunks) * 8;
    uint4 chunk = make_uint4(0, 0, 0, 0);
    if (row0 + r < T_) chunk = *reinterpret_cast<const uint4*>(rows + (row0 + r) * stride + c);
    *reinterpret_cast<uint4*>(tile + r * kOperandStride<D> + c) = chunk;
  }
}

// Rows [row0, row0 + kTile) of a [B, H, T] F32 vector (lse, delta) of one head.
__device__ void load_row_values(float* dst, const float* head_values, int64_t row0, int64_t T_) {
  for (int i = threadIdx.x; i < kTile; i += kThreads) {
    dst[i] = row0 + i < T_ ? head_values[row0 + i] : 0.0f;
  }
}

// out[16][kTile] (FP32, row stride kScoreStride) = A B^T for a warp: A is 16 rows of a shared
// [kTile][D] tile, B a whole one. Row r of out holds A's row r dotted with every row of B.
template <int D, class T>
__device__ void warp_row_products(const T* a_rows, const T* b_tile, float* out) {
  using E = typename WmmaType<T>::type;
  for (int n = 0; n < kTile / kFrag; ++n) {
    wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int k = 0; k < D / kFrag; ++k) {
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, E, wmma::row_major> a;
      // B^T's column n is B's row n: a column-major view of B's rows.
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, E, wmma::col_major> b;
      wmma::load_matrix_sync(a, reinterpret_cast<const E*>(a_rows + k * kFrag), kOperandStride<D>);
      wmma::load_matrix_sync(
          b, reinterpret_cast<const E*>(b_tile + n * kFrag * kOperandStride<D> + k * kFrag),
          kOperandStride<D>);
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(out + n * kFrag, acc, kScoreStride, wmma::mem_row_major);
  }
}

// acc[16][D] (FP32, row stride kAccStride) += A B for a warp: A is its [16][kTile] 16-bit
// probabilities (row stride kProbStride), B a shared [kTile][D] tile.
template <int D, class T>
__device__ void warp_accumulate(const T* a, const T* b_tile, float* acc_rows) {
  using E = typename WmmaType<T>::type;
  for (int n = 0; n < D / kFrag; ++n) {
    wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float> acc;
    wmma::load_matrix_sync(acc, acc_rows + n * kFrag, kAccStride<D>, wmma::mem_row_major);
    for (int k = 0; k < kTile / kFrag; ++k) {
      wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, E, wmma::row_major> pa;
      wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, E, wmma::row_major> b;
      wmma::load_matrix_sync(pa, reinterpret_cast<const E*>(a + k * kFrag), kProbStride);
      wmma::load_matrix_sync(
          b, reinterpret_cast<const E*>(b_tile + k * kFrag * kOperandStride<D> + n * kFrag),
          kOperandStride<D>);
      wmma::mma_sync(acc, pa, b, acc);
    }
    wmma::store_matrix_sync(acc_rows + n * kFrag, acc, kAccStride<D>, wmma::mem_row_major);
  }
}

// A warp's 16 accumulator rows, rounded, into rows [row0, row0 + 16) of one head's channels
// (`rows` at row 0's first channel, `stride` elements apart); rows at or past T are not
// written.
template <int D, class T>
__device__ void store_warp_rows(const float* acc_rows, T* rows, int64_t stride, int64_t row0,
                                int64_t T_) {
  const int lane = threadIdx.x % kWarpSize;
  for (int e = lane; e < kFrag * D; e += kWarpSize) {
    const int r = e / D, c = e % D;
    if (row0 + r < T_) rows[(row0 + r) * stride + c] = round_to<T>(acc_rows[r * kAccStride<D> + c]);
  }
}

template <int D>
__device__ void zero_warp_rows(float* acc_rows) {
  const int lane = threadIdx.x % kWarpSize;
  for (int e = lane; e < kFrag * kAccStride<D>; e += kWarpSize) acc_rows[e] = 0.0f;
}

// ---------------------------------------------------------------------------------------
// Forward. Grid (B*H, query tiles), the longest rows (last tiles) launched first.
template <int D, class T>
__global__ void __launch_bounds__(kThreads)
    flash_forward_kernel(const T* __restrict__ qkv, T* __restrict__ out, float* __restrict__ lse,
                         int64_t T_, int64_t C, int64_t H, float scale) {
  extern __shared__ __align__(128) unsigned char shared[];
  SharedRegions regions(shared);
  const ForwardShared<D, T> s(regions);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const int64_t q0 = (gridDim.y - 1 - blockIdx.y) * static_cast<int64_t>(kTile);
  const T* head = qkv + b * T_ * 3 * C + h * D;

  float* scores = s.scores + warp * kFrag * kScoreStride;
  T* probs = s.probs + warp * kFrag * kProbStride;
  float* acc = s.out + warp * kFrag * kAccStride<D>;
  load_tile<D>(s.q, head, 3 * C, q0, T_);
  zero_warp_rows<D>(acc);
  // Lanes 2r and 2r + 1 share row r of the warp's 16: both keep its running maximum and sum;
  // each takes every other column (interleaved, so that a warp's reads spread over the banks).
  const int r = lane / 2, side = lane % 2;
  const int64_t t = q0 + warp * kFrag + r;
  float row_max = -INFINITY, row_sum = 0.0f;
  for (int64_t k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // the last tile's K and V are no longer read
    load_tile<D>(s.k, head + C, 3 * C, k0, T_);
    load_tile<D>(s.v, head + 2 * C, 3 * C, k0, T_);
    __syncthreads();
    warp_row_products<D>(s.q + warp * kFrag * kOperandStride<D>, s.k, scores);
    __syncwarp();

    // Masked keys (after t, or past T) are -inf: exp gives them 0. Every row has a visible key
    // in every tile it reaches (k0 <= t), so the maximum is finite for finite inputs.
    float z[kTile / 2];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile / 2; ++j) {
      const int col = 2 * j + side;
      const int64_t t2 = k0 + col;
      z[j] = t2 <= t && t2 < T_ ? scale * scores[r * kScoreStride + col] : -INFINITY;
      tile_max = softmax_max(tile_max, z[j]);
    }
    tile_max = softmax_max(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    const float new_max = softmax_max(row_max, tile_max);
    float tile_sum = 0.0f;
#pragma unroll
    for (int j = 0; j < kTile / 2; ++j) {
      const float p = softmax_exp(z[j], new_max);
      tile_sum += p;
      probs[r * kProbStride + 2 * j + side] = round_to<T>(p);
    }
    tile_sum += __shfl_xor_sync(0xffffffffu, tile_sum, 1);
    const float rescale = softmax_rescale(row_max, new_max);
    row_sum = row_sum * rescale + tile_sum;
    row_max = new_max;
    for (int c = side; c < D; c += 2) acc[r * kAccStride<D> + c] *= rescale;
    __syncwarp();
    warp_accumulate<D>(probs, s.v, acc);
  }
  __syncwarp();
  if (t < T_) {
    const float inv_sum = 1.0f / row_sum;
    T* row = out + (b * T_ + t) * C + h * D;
    for (int c = side; c < D; c += 2) row[c] = round_to<T>(acc[r * kAccStride<D> + c] * inv_sum);
    if (side == 0) lse[bh * T_ + t] = softmax_log_sum_exp(row_max, row_sum);
  }
}

// ---------------------------------------------------------------------------------------
// Backward. delta[b, h, t] = dout_t . out_t over the head's D channels: one warp per row.
template <class T>
__global__ void row_dots_kernel(const T* __restrict__ dout, const T* __restrict__ out,
                                float* __restrict__ delta, int64_t B, int64_t T_, int64_t C,
                                int64_t H, int64_t D) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t warps = grid_stride() / kWarpSize;
  for (int64_t row = global_thread_index() / kWarpSize; row < B * H * T_; row += warps) {
    const int64_t b = row / (H * T_), h = row / T_ % H, t = row % T_;
    const int64_t base = (b * T_ + t) * C + h * D;
    float sum = 0.0f;
    for (int64_t c = lane; c < D; c += kWarpSize)
      sum += to_float(dout[base + c]) * to_float(out[base + c]);
    sum = warp_sum(sum);
    if (lane == 0) delta[row] = sum;
  }
}

// P and dS of one (row, column) of a warp's tile: p = exp(scale s - lse) and
// ds = scale p (dp - delta); both 0 where the key is masked.
struct ProbAndGrad {
  float p, ds;
};
__device__ __forceinline__ ProbAndGrad prob_and_grad(bool visible, float score, float dprob,
                                                     float row_lse, float row_delta, float scale) {
  if (!visible) return {0.0f, 0.0f};
  const float p = softmax_exp(scale * score, row_lse);
  return {p, scale * softmax_backward(p, dprob, row_delta)};
}

// dK and dV of one key tile. Grid (B*H, key tiles), the first tiles (seen by most queries)
// launched first. Warp w owns keys k0 + 16w ... and computes, per query tile, the transposed
// products S^T = K_w Q^T and dP^T = V_w dout^T, so that dV += P^T dout and dK += dS^T Q are
// plain products of its rows.
template <int D, class T>
__global__ void __launch_bounds__(kThreads)
    flash_key_grad_kernel(const T* __restrict__ qkv, const T* __restrict__ dout,
                          const float* __restrict__ lse, const float* __restrict__ delta,
                          T* __restrict__ dqkv, int64_t T_, int64_t C, int64_t H, float scale) {
  extern __shared__ __align__(128) unsigned char shared[];
  SharedRegions regions(shared);
  const KeyGradShared<D, T> s(regions);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const int64_t k0 = blockIdx.y * static_cast<int64_t>(kTile);
  const T* head = qkv + b * T_ * 3 * C + h * D;
  const T* dhead = dout + b * T_ * C + h * D;

  float* scores = s.scores + warp * kFrag * kScoreStride;
  float* dprobs = s.dprobs + warp * kFrag * kScoreStride;
  T* probs = s.probs + warp * kFrag * kProbStride;
  T* dscores = s.dscores + warp * kFrag * kProbStride;
  float* dk = s.dk + warp * kFrag * kAccStride<D>;
  float* dv = s.dv + warp * kFrag * kAccStride<D>;
  load_tile<D>(s.k, head + C, 3 * C, k0, T_);
  load_tile<D>(s.v, head + 2 * C, 3 * C, k0, T_);
  zero_warp_rows<D>(dk);
  zero_warp_rows<D>(dv);
  const int64_t first_key = k0 + warp * kFrag;
  for (int64_t q0 = k0; q0 < T_; q0 += kTile) {
    __syncthreads();  // the last query tile is no longer read
    load_tile<D>(s.q, head, 3 * C, q0, T_);
    load_tile<D>(s.dout, dhead, C, q0, T_);
    load_row_values(s.lse, lse + bh * T_, q0, T_);
    load_row_values(s.delta, delta + bh * T_, q0, T_);
    __syncthreads();
    warp_row_products<D>(s.k + warp * kFrag * kOperandStride<D>, s.q, scores);
    warp_row_products<D>(s.v + warp * kFrag * kOperandStride<D>, s.dout, dprobs);
    __syncwarp();
    for (int e = lane; e < kFrag * kTile; e += kWarpSize) {
      const int i = e / kTile, j = e % kTile;  // key first_key + i, query q0 + j
      const int64_t t = q0 + j;
      const ProbAndGrad g =
          prob_and_grad(first_key + i <= t && t < T_, scores[i * kScoreStride + j],
                        dprobs[i * kScoreStride + j], s.lse[j], s.delta[j], scale);
      probs[i * kProbStride + j] = round_to<T>(g.p);
      dscores[i * kProbStride + j] = round_to<T>(g.ds);
    }
    __syncwarp();
    warp_accumulate<D>(probs, s.dout, dv);
    warp_accumulate<D>(dscores, s.q, dk);
  }
  __syncwarp();
  store_warp_rows<D>(dk, dqkv + b * T_ * 3 * C + C + h * D, 3 * C, first_key, T_);
  store_warp_rows<D>(dv, dqkv + b * T_ * 3 * C + 2 * C + h * D, 3 * C, first_key, T_);
}

// dQ of one query tile. Grid (B*H, query tiles), the last tiles first. Warp w owns queries
// q0 + 16w ...: S = Q_w K^T and dP = dout_w V^T per key tile, then dQ += dS K.
template <int D, class T>
__global__ void __launch_bounds__(kThreads)
    flash_query_grad_kernel(const T* __restrict__ qkv, const T* __restrict__ dout,
                            const float* __restrict__ lse, const float* __restrict__ delta,
                            T* __restrict__ dqkv, int64_t T_, int64_t C, int64_t H, float scale) {
  extern __shared__ __align__(128) unsigned char shared[];
  SharedRegions regions(shared);
  const QueryGradShared<D, T> s(regions);
  const int warp = threadIdx.x / kWarpSize, lane = threadIdx.x % kWarpSize;
  const int64_t bh = blockIdx.x, b = bh / H, h = bh % H;
  const int64_t q0 = (gridDim.y - 1 - blockIdx.y) * static_cast<int64_t>(kTile);
  const T* head = qkv + b * T_ * 3 * C + h * D;

  float* scores = s.scores + warp * kFrag * kScoreStride;
  float* dprobs = s.dprobs + warp * kFrag * kScoreStride;
  T* dscores = s.dscores + warp * kFrag * kProbStride;
  float* dq = s.dq + warp * kFrag * kAccStride<D>;
  load_tile<D>(s.q, head, 3 * C, q0, T_);
  load_tile<D>(s.dout, dout + b * T_ * C + h * D, C, q0, T_);
  load_row_values(s.lse, lse + bh * T_, q0, T_);
  load_row_values(s.delta, delta + bh * T_, q0, T_);
  zero_warp_rows<D>(dq);
  const int first_row = warp * kFrag;  // of the tile
  for (int64_t k0 = 0; k0 <= q0; k0 += kTile) {
    __syncthreads();  // the last key tile is no longer read
    load_tile<D>(s.k, head + C, 3 * C, k0, T_);
    load_tile<D>(s.v, head + 2 * C, 3 * C, k0, T_);
    __syncthreads();
    warp_row_products<D>(s.q + first_row * kOperandStride<D>, s.k, scores);
    warp_row_products<D>(s.dout + first_row * kOperandStride<D>, s.v, dprobs);
    __syncwarp();
    for (int e = lane; e < kFrag * kTile; e += kWarpSize) {
      const int i = e / kTile, j = e % kTile;  // query q0 + first_row + i, key k0 + j
      const int64_t t = q0 + first_row + i;
      const ProbAndGrad g = prob_and_grad(k0 + j <= t && t < T_, scores[i * kScoreStride + j],
                                          dprobs[i * kScoreStride + j], s.lse[first_row + i],
                                          s.delta[first_row + i], scale);
      dscores[i * kProbStride + j] = round_to<T>(g.ds);
    }
    __syncwarp();
    warp_accumulate<D>(dscores, s.k, dq);
  }
  __syncwarp();
  store_warp_rows<D>(dq, dqkv + b * T_ * 3 * C + h * D, 3 * C, q0 + first_row, T_);
}

// ---------------------------------------------------------------------------------------
// Calls f(std::integral_constant<int, D>, T) for a dtype and head size the kernels take
// (unsupported_flash_attention has said yes before any call).
template <class F>
void dispatch_flash(DType dtype, int64_t head_dim, F&& f) {
  const auto by_head = [&](auto tag) {
    if (head_dim == 64) {
      f(std::integral_constant<int, 64>{}, tag);
    } else {
      f(std::integral_constant<int, 128>{}, tag);
    }
  };
  if (dtype == DType::kBF16) {
    by_head(bf16{});
  } else {
    by_head(fp16{});
  }
}

// The most shared memory any of the three kernels needs for this head size.
template <int D, class T>
size_t flash_shared_bytes() {
  return std::max({shared_bytes<ForwardShared<D, T>>(), shared_bytes<KeyGradShared<D, T>>(),
                   shared_bytes<QueryGradShared<D, T>>()});
}

void require_flash_kernels(const char* op, const std::string& unsupported) {
  MANTISSA_CHECK(unsupported.empty(), op << ": " << unsupported);
}

void require_aligned(const char* op, const char* name, const Tensor& t) {
  MANTISSA_CHECK(aligned16(t.data()), op << ": operand " << name << " " << t.describe()
                                         << " must start on a 16-byte boundary (the kernels "
                                            "read it 16 bytes at a time)");
}

dim3 flash_grid(const char* op, int64_t B, int64_t H, int64_t T) {
  const int64_t tiles = ceil_div(T, kTile);
  MANTISSA_CHECK(tiles <= 65535, op << ": T = " << T << " is above the kernels' limit of "
                                    << 65535 * kTile << " positions");
  return dim3(static_cast<unsigned>(B * H), static_cast<unsigned>(tiles));
}

}  // namespace

std::string CudaBackend::unsupported_flash_attention(DType qkv, int64_t head_dim) const {
  if (qkv != DType::kBF16 && qkv != DType::kF16) {
    return std::string("the CUDA flash-attention kernels take bf16 or f16 operands, not ") +
           dtype_name(qkv);
  }
  if (head_dim != 64 && head_dim != 128) {
    return "the CUDA flash-attention kernels take head sizes 64 and 128, not " +
           std::to_string(head_dim);
  }
  size_t needed = 0;
  dispatch_flash(qkv, head_dim, [&](auto d, auto tag) {
    needed = flash_shared_bytes<decltype(d)::value, decltype(tag)>();
  });
  if (needed > static_cast<size_t>(max_shared_per_block_)) {
    return "head size " + std::to_string(head_dim) + " needs " + std::to_string(needed) +
           " bytes of shared memory per block; cuda:" + std::to_string(device_index_) + " allows " +
           std::to_string(max_shared_per_block_);
  }
  return "";
}

void CudaBackend::flash_attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, int n_head) {
  const char* op = "flash_attention_forward";
  const AttentionDims d = check_flash_attention_forward(qkv, out, lse, n_head, device());
  require_flash_kernels(op, unsupported_flash_attention(qkv.dtype(), d.D));
  require_aligned(op, "qkv", qkv);
  if (d.B * d.T == 0) return;
  const dim3 grid = flash_grid(op, d.B, d.H, d.T);
  const float scale = attention_scale(d.D);
  dispatch_flash(qkv.dtype(), d.D, [&](auto head_dim, auto tag) {
    constexpr int kD = decltype(head_dim)::value;
    using E = decltype(tag);
    const size_t bytes = shared_bytes<ForwardShared<kD, E>>();
    allow_shared_bytes(flash_forward_kernel<kD, E>, bytes);
    flash_forward_kernel<kD, E><<<grid, kThreads, bytes, stream()>>>(
        qkv.data_as<const E>(), out.data_as<E>(), lse.data_as<float>(), d.T, d.C, d.H, scale);
    MANTISSA_CUDA_CHECK_LAUNCH();
  });
}

void CudaBackend::flash_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                           const Tensor& lse, Tensor& dqkv, int n_head) {
  const char* op = "flash_attention_backward";
  const AttentionDims d =
      check_flash_attention_backward(dout, qkv, out, lse, dqkv, n_head, device());
  require_flash_kernels(op, unsupported_flash_attention(qkv.dtype(), d.D));
  require_aligned(op, "qkv", qkv);
  require_aligned(op, "dout", dout);
  if (d.B * d.T == 0) return;
  const dim3 grid = flash_grid(op, d.B, d.H, d.T);
  const float scale = attention_scale(d.D);
  Tensor delta = Tensor::empty(lse.shape(), DType::kF32, device());
  dispatch_flash(qkv.dtype(), d.D, [&](auto head_dim, auto tag) {
    constexpr int kD = decltype(head_dim)::value;
    using E = decltype(tag);
    constexpr int kRowBlock = 256;
    const int64_t rows = d.B * d.H * d.T;
    row_dots_kernel<E>
        <<<grid_size(rows * kWarpSize, kRowBlock, multiprocessor_count_), kRowBlock, 0, stream()>>>(
            dout.data_as<const E>(), out.data_as<const E>(), delta.data_as<float>(), d.B, d.T, d.C,
            d.H, d.D);
    MANTISSA_CUDA_CHECK_LAUNCH();

    const size_t key_bytes = shared_bytes<KeyGradShared<kD, E>>();
    allow_shared_bytes(flash_key_grad_kernel<kD, E>, key_bytes);
    flash_key_grad_kernel<kD, E><<<grid, kThreads, key_bytes, stream()>>>(
        qkv.data_as<const E>(), dout.data_as<const E>(), lse.data_as<const float>(),
        delta.data_as<const float>(), dqkv.data_as<E>(), d.T, d.C, d.H, scale);
    MANTISSA_CUDA_CHECK_LAUNCH();

    const size_t query_bytes = shared_bytes<QueryGradShared<kD, E>>();
    allow_shared_bytes(flash_query_grad_kernel<kD, E>, query_bytes);
    flash_query_grad_kernel<kD, E><<<grid, kThreads, query_bytes, stream()>>>(
        qkv.data_as<const E>(), dout.data_as<const E>(), lse.data_as<const float>(),
        delta.data_as<const float>(), dqkv.data_as<E>(), d.T, d.C, d.H, scale);
    MANTISSA_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mantissa::core
