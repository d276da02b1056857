// LayerNorm, causal self-attention, token/position embeddings and the fused softmax
// cross-entropy on the GPU. The math follows llm.c and, term for term, cpu_layers.cpp:
// FP32 internally, one rounding to nearest even per stored value.
//
// The operands of these ops may each be F32, BF16 or F16 independently (activations, and
// parameters: the FP32 masters or a BF16 or F16 compute copy), so instead of templating
// every kernel on every combination the kernels see their operands as FloatIn / FloatOut: a
// pointer and a dtype, switched on per access. The dtype is the same for the whole grid, so
// the switch is a uniform branch, not divergence; LayerNorm forward, the one memory-bound
// kernel here that the benchmarks watch, also has a path with 16-byte accesses.
//
// Determinism: no kernel here uses floating-point atomics. Parameter gradients are reduced
// in a fixed order: dgamma/dbeta by fixed blocks of rows (cuda_kernel_utils.cuh), dwpe and
// dwte in position order, exactly as the CPU backend adds them, so those two are
// bit-identical to the CPU's.
//
// Out-of-range tokens and targets: the indices live on the device, so they are checked by a
// small kernel whose result (the first bad position) is read back at once. That waits for
// the stream, one synchronisation per embedding_forward, embedding_backward and
// softmax_cross_entropy call, and buys the CPU backend's behaviour: the call that received a
// bad index throws, naming the index and its position, before any kernel uses it.
#include <cub/device/device_radix_sort.cuh>

#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarpSize;

// ---------------------------------------------------------------------------------------
// Operands with a run-time dtype (F32, BF16 or F16).

struct FloatIn {
  const void* data;
  DType dtype;
};
struct FloatOut {
  void* data;
  DType dtype;
};

FloatIn as_in(const Tensor& t) {
  return {t.data(), t.dtype()};
}
FloatOut as_out(Tensor& t) {
  return {t.data(), t.dtype()};
}

__device__ __forceinline__ float load(FloatIn t, int64_t i) {
  switch (t.dtype) {
    case DType::kBF16: return bf16_to_float(static_cast<const bf16*>(t.data)[i]);
    case DType::kF16: return fp16_to_float(static_cast<const fp16*>(t.data)[i]);
    default: return static_cast<const float*>(t.data)[i];
  }
}

__device__ __forceinline__ void store(FloatOut t, int64_t i, float v) {
  switch (t.dtype) {
    case DType::kBF16: static_cast<bf16*>(t.data)[i] = bf16_from_float(v); break;
    case DType::kF16: static_cast<fp16*>(t.data)[i] = fp16_from_float(v); break;
    default: static_cast<float*>(t.data)[i] = v;
  }
}

// W consecutive elements starting at i: with W = 8 one 16-byte access (two for F32), which
// needs i * sizeof(element) and the base pointer 16-byte aligned; with W = 1 a scalar.
template <int W, class T>
__device__ __forceinline__ void load_as_float(const T* p, float (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = to_float(p[0]);
  } else {
    const Pack<T, W> pack = load_pack<W>(p);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = to_float(pack.v[k]);
  }
}

template <int W, class T>
__device__ __forceinline__ void store_from_float(T* p, const float (&v)[W]) {
  if constexpr (W == 1) {
    p[0] = round_to<T>(v[0]);
  } else {
    Pack<T, W> pack;
#pragma unroll
    for (int k = 0; k < W; ++k) pack.v[k] = round_to<T>(v[k]);
    store_pack<W>(p, pack);
  }
}

template <int W>
__device__ __forceinline__ void load_chunk(FloatIn t, int64_t i, float (&v)[W]) {
  switch (t.dtype) {
    case DType::kBF16: return load_as_float<W>(static_cast<const bf16*>(t.data) + i, v);
    case DType::kF16: return load_as_float<W>(static_cast<const fp16*>(t.data) + i, v);
    default: return load_as_float<W>(static_cast<const float*>(t.data) + i, v);
  }
}

template <int W>
__device__ __forceinline__ void store_chunk(FloatOut t, int64_t i, const float (&v)[W]) {
  switch (t.dtype) {
    case DType::kBF16: return store_from_float<W>(static_cast<bf16*>(t.data) + i, v);
    case DType::kF16: return store_from_float<W>(static_cast<fp16*>(t.data) + i, v);
    default: return store_from_float<W>(static_cast<float*>(t.data) + i, v);
  }
}

bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// ---------------------------------------------------------------------------------------
// Index checks. The rest of the validation is op_checks.h's, shared with the CPU backend.

// Records the smallest flat index whose value lies outside [0, limit). first_bad starts as
// all ones (no bad index) and only ever decreases; a thread's own indices increase, so it
// stops at its first bad one.
__global__ void find_bad_index_kernel(const int32_t* __restrict__ indices, int64_t n, int64_t limit,
                                      unsigned long long* __restrict__ first_bad) {
  for (int64_t i = global_thread_index(); i < n; i += grid_stride()) {
    const int32_t v = indices[i];
    if (v < 0 || v >= limit) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
      return;
    }
  }
}

// Tokens or targets are indices into a table of `limit` rows; an index outside it would read
// or write out of bounds, so it is reported with its position before any work starts. See
// the file comment for why this synchronises.
void check_indices(const char* op, const char* name, const Tensor& indices, int64_t limit,
                   int multiprocessor_count, cudaStream_t stream) {
  const int64_t n = indices.numel();
  if (n == 0) return;
  Tensor first_bad = Tensor::empty(Shape{1}, DType::kI64, indices.device());
  MANTISSA_CUDA_CHECK(cudaMemsetAsync(first_bad.data(), 0xFF, sizeof(uint64_t), stream));
  find_bad_index_kernel<<<grid_size(n, kBlock, multiprocessor_count), kBlock, 0, stream>>>(
      indices.data_as<const int32_t>(), n, limit, first_bad.data_as<unsigned long long>());
  MANTISSA_CUDA_CHECK_LAUNCH();
  uint64_t bad = 0;
  MANTISSA_CUDA_CHECK(
      cudaMemcpyAsync(&bad, first_bad.data(), sizeof bad, cudaMemcpyDeviceToHost, stream));
  MANTISSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (bad == ~uint64_t{0}) return;
  const auto i = static_cast<int64_t>(bad);
  int32_t value = 0;
  MANTISSA_CUDA_CHECK(cudaMemcpyAsync(&value, indices.data_as<const int32_t>() + i, sizeof value,
                                      cudaMemcpyDeviceToHost, stream));
  MANTISSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  fail_index_out_of_range(op, name, indices, i, value, limit);
}

// ---------------------------------------------------------------------------------------
// LayerNorm forward: one warp per row of x[N, C].
//   mean = sum(x) / C,  var = sum((x - mean)^2) / C (two passes: no E[x^2] - E[x]^2
//   cancellation),  rstd = 1 / sqrt(var + 1e-5),  out = (x - mean) * rstd * gamma + beta.
// Each lane takes W consecutive channels at a time (W = 8: 16-byte accesses). The row is
// read three times; the second and third reads hit in L1/L2, which is cheaper than staging
// the row in shared memory for any C.
template <int W>
__global__ void layernorm_forward_kernel(FloatIn x, FloatIn gamma, FloatIn beta, FloatOut y,
                                         float* __restrict__ mean, float* __restrict__ rstd,
                                         int64_t rows, int64_t C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together
  const int64_t base = row * C;

  float sum = 0.0f;
  for (int64_t c = lane * W; c < C; c += kWarpSize * W) {
    float v[W];
    load_chunk<W>(x, base + c, v);
#pragma unroll
    for (int k = 0; k < W; ++k) sum += v[k];
  }
  const float m = warp_sum(sum) / static_cast<float>(C);

  float squares = 0.0f;
  for (int64_t c = lane * W; c < C; c += kWarpSize * W) {
    float v[W];
    load_chunk<W>(x, base + c, v);
#pragma unroll
    for (int k = 0; k < W; ++k) squares += (v[k] - m) * (v[k] - m);
  }
  const float s = 1.0f / sqrtf(warp_sum(squares) / static_cast<float>(C) + 1e-5f);

  for (int64_t c = lane * W; c < C; c += kWarpSize * W) {
    float v[W], g[W], b[W];
    load_chunk<W>(x, base + c, v);
    load_chunk<W>(gamma, c, g);
    load_chunk<W>(beta, c, b);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = (v[k] - m) * s * g[k] + b[k];
    store_chunk<W>(y, base + c, v);
  }
  if (lane == 0) {
    mean[row] = m;
    rstd[row] = s;
  }
}

// LayerNorm backward, dx: one warp per row. With xhat = (x - mean) * rstd and
// dnorm = dout * gamma:  dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)).
__global__ void layernorm_backward_dx_kernel(FloatIn dout, FloatIn x, FloatIn gamma,
                                             const float* __restrict__ mean,
                                             const float* __restrict__ rstd, FloatOut dx,
                                             int64_t rows, int64_t C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int64_t base = row * C;
  const float m = mean[row];
  const float s = rstd[row];

  float dnorm_sum = 0.0f;
  float dnorm_xhat_sum = 0.0f;
  for (int64_t c = lane; c < C; c += kWarpSize) {
    const float xhat = (load(x, base + c) - m) * s;
    const float dnorm = load(dout, base + c) * load(gamma, c);
    dnorm_sum += dnorm;
    dnorm_xhat_sum += dnorm * xhat;
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / static_cast<float>(C);
  const float dnorm_xhat_mean = warp_sum(dnorm_xhat_sum) / static_cast<float>(C);

  for (int64_t c = lane; c < C; c += kWarpSize) {
    const float xhat = (load(x, base + c) - m) * s;
    const float dnorm = load(dout, base + c) * load(gamma, c);
    store(dx, base + c, (dnorm - dnorm_mean - xhat * dnorm_xhat_mean) * s);
  }
}

// LayerNorm backward, first stage of dgamma += sum over rows of dout * xhat and
// dbeta += sum over rows of dout: per (column, block of kColumnRowBlock rows) partial sums,
// finished by add_column_partials. Consecutive threads take consecutive columns (coalesced).
__global__ void layernorm_param_partials_kernel(FloatIn dout, FloatIn x,
                                                const float* __restrict__ mean,
                                                const float* __restrict__ rstd, int64_t rows,
                                                int64_t C, int64_t n_blocks,
                                                float* __restrict__ dgamma_partials,
                                                float* __restrict__ dbeta_partials) {
  const int64_t c = global_thread_index();
  if (c >= C) return;
  for (int64_t block = blockIdx.y; block < n_blocks; block += gridDim.y) {
    const int64_t row_end = min(rows, (block + 1) * kColumnRowBlock);
    float g_sum = 0.0f;
    float b_sum = 0.0f;
    for (int64_t r = block * kColumnRowBlock; r < row_end; ++r) {
      const float dy = load(dout, r * C + c);
      g_sum += dy * ((load(x, r * C + c) - mean[r]) * rstd[r]);
      b_sum += dy;
    }
    dgamma_partials[block * C + c] = g_sum;
    dbeta_partials[block * C + c] = b_sum;
  }
}

// The query row one warp of an attention kernel handles: row = (b, h, t) of [B, H, T], with
// token_stride the distance between the qkv rows of two positions and head_base the offset
// of q at (b, t = 0, h). Past the last row in_range is false and the rest is left zero.
struct AttentionRow {
  bool in_range;
  int lane, warp;
  int64_t row, t, b, h, token_stride, head_base;
};

__device__ AttentionRow attention_row(int64_t B, int64_t T, int64_t C, int64_t H, int64_t D) {
  AttentionRow r{};
  r.lane = threadIdx.x % kWarpSize;
  r.warp = threadIdx.x / kWarpSize;
  r.row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarpSize) + r.warp;
  r.in_range = r.row < B * H * T;
  if (!r.in_range) return r;
  r.t = r.row % T;
  r.b = r.row / (H * T);
  r.h = (r.row / T) % H;
  r.token_stride = 3 * C;                            // qkv row of one position
  r.head_base = r.b * T * r.token_stride + r.h * D;  // q of (b, t = 0, h)
  return r;
}

// ---------------------------------------------------------------------------------------
// Causal self-attention: one warp per query row (b, h, t), rows ordered so that the warps of
// a block share (b, h) and find that head's K and V rows in L1. With scale = 1 / sqrt(D):
//   scores[t2] = scale * q_t . k_t2  for t2 <= t   (lanes split the D channels, then a
//                                                    warp sum: coalesced K reads)
//   P[t]       = softmax(scores), zero beyond t     (FP32, in probs)
//   out_t      = sum_t2 P[t][t2] v_t2               (lanes over channels, keys in order)
// probs is FP32 [B, H, T, T]: att itself when att is F32. A BF16 or F16 att receives P
// rounded once, while out, as on the CPU, uses the FP32 probabilities.
// The query row is staged in shared memory as FP32 (dynamic: warps * D floats).
__global__ void attention_forward_kernel(FloatIn qkv, FloatOut y, float* __restrict__ probs,
                                         FloatOut att, int64_t B, int64_t T, int64_t C, int64_t H,
                                         int64_t D, float scale) {
  extern __shared__ float shared_q[];
  const auto [in_range, lane, warp, row, t, b, h, token_stride, head_base] =
      attention_row(B, T, C, H, D);
  if (!in_range) return;

  float* q = shared_q + warp * D;
  for (int64_t d = lane; d < D; d += kWarpSize) q[d] = load(qkv, head_base + t * token_stride + d);
  __syncwarp();

  float* p = probs + row * T;  // P[b, h, t, :]
  float max_score = -INFINITY;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    const int64_t k_base = head_base + t2 * token_stride + C;
    float partial = 0.0f;
    for (int64_t d = lane; d < D; d += kWarpSize) partial += q[d] * load(qkv, k_base + d);
    const float score = warp_sum(partial) * scale;  // every lane holds it
    if (lane == 0) p[t2] = score;
    // A NaN score never wins the comparison but still turns the sum, hence the row, NaN.
    max_score = score > max_score ? score : max_score;
  }
  __syncwarp();  // lane 0's scores become visible to the whole warp

  float sum = 0.0f;
  for (int64_t t2 = lane; t2 <= t; t2 += kWarpSize) {
    const float e = expf(p[t2] - max_score);
    p[t2] = e;
    sum += e;
  }
  const float inv_sum = 1.0f / warp_sum(sum);
  for (int64_t t2 = lane; t2 < T; t2 += kWarpSize) {
    const float prob = t2 <= t ? p[t2] * inv_sum : 0.0f;
    p[t2] = prob;
    if (att.dtype != DType::kF32) store(att, row * T + t2, prob);
  }
  __syncwarp();

  for (int64_t d = lane; d < D; d += kWarpSize) {
    float o = 0.0f;
    for (int64_t t2 = 0; t2 <= t; ++t2)
      o += p[t2] * load(qkv, head_base + t2 * token_stride + 2 * C + d);
    store(y, (b * T + t) * C + h * D + d, o);
  }
}

// Attention backward, per query row (P = att[t], dy = dout_t), the first of two kernels:
//   dP[t2]      = dy . v_t2                                  (warp sum over channels)
//   dscores[t2] = scale * P[t2] (dP[t2] - sum_j P[j] dP[j])  (softmax Jacobian)
//   dq_t        = sum_t2 dscores[t2] k_t2
// dscores goes to an FP32 scratch [B, H, T, T] that the second kernel reads by column.
__global__ void attention_backward_query_kernel(FloatIn dout, FloatIn qkv, FloatIn att,
                                                float* __restrict__ dscores, FloatOut dqkv,
                                                int64_t B, int64_t T, int64_t C, int64_t H,
                                                int64_t D, float scale) {
  extern __shared__ float shared_dy[];
  const auto [in_range, lane, warp, row, t, b, h, token_stride, head_base] =
      attention_row(B, T, C, H, D);
  if (!in_range) return;

  float* dy = shared_dy + warp * D;
  for (int64_t d = lane; d < D; d += kWarpSize) dy[d] = load(dout, (b * T + t) * C + h * D + d);
  __syncwarp();

  const int64_t p_row = row * T;  // P[t] = att[b, h, t, :]
  float* ds = dscores + row * T;
  float p_dp = 0.0f;
  for (int64_t t2 = 0; t2 <= t; ++t2) {
    const int64_t v_base = head_base + t2 * token_stride + 2 * C;
    float partial = 0.0f;
    for (int64_t d = lane; d < D; d += kWarpSize) partial += dy[d] * load(qkv, v_base + d);
    const float dp = warp_sum(partial);
    if (lane == 0) ds[t2] = dp;
    p_dp += load(att, p_row + t2) * dp;
  }
  __syncwarp();
  for (int64_t t2 = lane; t2 <= t; t2 += kWarpSize) {
    ds[t2] = load(att, p_row + t2) * (ds[t2] - p_dp) * scale;
  }
  __syncwarp();

  for (int64_t d = lane; d < D; d += kWarpSize) {
    float dq = 0.0f;
    for (int64_t t2 = 0; t2 <= t; ++t2)
      dq += ds[t2] * load(qkv, head_base + t2 * token_stride + C + d);
    store(dqkv, head_base + t * token_stride + d, dq);
  }
}

// Attention backward, second kernel, per key row (b, h, t2): the sums over the query rows
// that see key t2, in query order (the CPU backend's order), with lanes over channels:
//   dk_t2 = sum_{t >= t2} dscores[t][t2] q_t,   dv_t2 = sum_{t >= t2} P[t][t2] dout_t
// Gathering by key instead of scattering from each query keeps this free of atomics.
__global__ void attention_backward_key_kernel(FloatIn dout, FloatIn qkv, FloatIn att,
                                              const float* __restrict__ dscores, FloatOut dqkv,
                                              int64_t B, int64_t T, int64_t C, int64_t H,
                                              int64_t D) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= B * H * T) return;
  const int64_t t2 = row % T;
  const int64_t bh = row / T;
  const int64_t b = bh / H;
  const int64_t h = bh % H;
  const int64_t token_stride = 3 * C;
  const int64_t head_base = b * T * token_stride + h * D;
  const int64_t p_column = bh * T * T + t2;  // P[t][t2] is att element p_column + t * T
  const float* ds_column = dscores + bh * T * T + t2;

  for (int64_t d = lane; d < D; d += kWarpSize) {
    float dk = 0.0f;
    float dv = 0.0f;
    for (int64_t t = t2; t < T; ++t) {
      dk += ds_column[t * T] * load(qkv, head_base + t * token_stride + d);
      dv += load(att, p_column + t * T) * load(dout, (b * T + t) * C + h * D + d);
    }
    store(dqkv, head_base + t2 * token_stride + C + d, dk);
    store(dqkv, head_base + t2 * token_stride + 2 * C + d, dv);
  }
}

// Launch shape of the attention kernels that stage one D-float row per warp in shared
// memory: at most 8 warps per block, fewer for very wide heads, so that the staging fits the
// default 48 KiB. A head wider than that (D > 12288) is not supported here.
struct AttentionLaunch {
  int warps;
  size_t shared_bytes;
};

AttentionLaunch attention_launch(const char* op, int64_t D) {
  constexpr int64_t kSharedBytes = 48 * 1024;
  const int64_t row_bytes = D * static_cast<int64_t>(sizeof(float));
  MANTISSA_CHECK(row_bytes <= kSharedBytes, op << ": head size " << D
                                               << " is above the CUDA backend's limit of "
                                               << kSharedBytes / sizeof(float));
  const int warps = static_cast<int>(std::min<int64_t>(kWarpsPerBlock, kSharedBytes / row_bytes));
  return {warps, static_cast<size_t>(warps * row_bytes)};
}

// ---------------------------------------------------------------------------------------
// Embeddings.

// out[b, t, c] = wte[tokens[b, t], c] + wpe[t, c], one thread per element.
__global__ void embedding_forward_kernel(const int32_t* __restrict__ tokens, FloatIn wte,
                                         FloatIn wpe, FloatOut y, int64_t BT, int64_t T,
                                         int64_t C) {
  for (int64_t i = global_thread_index(); i < BT * C; i += grid_stride()) {
    const int64_t bt = i / C;
    const int64_t c = i % C;
    const int64_t token = tokens[bt];
    store(y, i, load(wte, token * C + c) + load(wpe, (bt % T) * C + c));
  }
}

// dwpe[t, c] += dout[0, t, c] + dout[1, t, c] + ..., one thread per (t, c), added into the
// gradient one batch row at a time as the CPU backend does.
__global__ void embedding_backward_wpe_kernel(FloatIn dout, float* __restrict__ dwpe, int64_t B,
                                              int64_t T, int64_t C) {
  for (int64_t i = global_thread_index(); i < T * C; i += grid_stride()) {
    float acc = dwpe[i];
    for (int64_t b = 0; b < B; ++b) acc += load(dout, b * T * C + i);
    dwpe[i] = acc;
  }
}

__global__ void iota_kernel(int32_t* __restrict__ out, int64_t n) {
  for (int64_t i = global_thread_index(); i < n; i += grid_stride())
    out[i] = static_cast<int32_t>(i);
}

// dwte[token] += dout[position] for every position of every token. The (token, position)
// pairs arrive sorted by token, positions ascending within a token (a stable radix sort), so
// the positions of one token form a contiguous run. The warp at the start of each run owns
// that dwte row: no two warps write the same row (no atomics) and each row receives its
// contributions in position order, like the CPU backend's loop. The price is that a token
// repeated r times is summed by one warp, r rows in sequence.
__global__ void embedding_backward_wte_kernel(FloatIn dout,
                                              const int32_t* __restrict__ sorted_tokens,
                                              const int32_t* __restrict__ sorted_positions,
                                              float* __restrict__ dwte, int64_t BT, int64_t C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (i >= BT) return;
  const int32_t token = sorted_tokens[i];
  if (i > 0 && sorted_tokens[i - 1] == token) return;  // not the start of a run
  int64_t run_end = i + 1;
  while (run_end < BT && sorted_tokens[run_end] == token) ++run_end;
  float* row = dwte + static_cast<int64_t>(token) * C;
  for (int64_t c = lane; c < C; c += kWarpSize) {
    float acc = row[c];
    for (int64_t j = i; j < run_end; ++j) acc += load(dout, sorted_positions[j] * C + c);
    row[c] = acc;
  }
}

// ---------------------------------------------------------------------------------------
// Fused softmax + cross-entropy, one block per row of logits[N, V]:
//   loss = logsumexp(z) - z[target] = max + log(sum exp(z - max)) - z[target]
//   dz   = (softmax(z) - onehot(target)) * grad_scale
// Every read of the row (z[target] included) happens before the block reductions' barriers
// and every write after them, each element written by the thread that read it, which is what
// lets dlogits alias logits.
constexpr int kCrossEntropyBlock = 512;

__global__ void softmax_cross_entropy_kernel(FloatIn logits, const int32_t* __restrict__ targets,
                                             float* __restrict__ losses, FloatOut dlogits,
                                             float grad_scale, int64_t V) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * V;
  const int32_t target = targets[blockIdx.x];
  const float z_target = load(logits, base + target);

  // A NaN logit never wins the comparison but makes the sum, hence the loss, NaN.
  float max_logit = -INFINITY;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    const float z = load(logits, base + v);
    max_logit = z > max_logit ? z : max_logit;
  }
  max_logit = block_max(max_logit);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x)
    sum += expf(load(logits, base + v) - max_logit);
  sum = block_sum(sum);
  if (threadIdx.x == 0) losses[blockIdx.x] = max_logit + logf(sum) - z_target;

  if (dlogits.data == nullptr) return;
  const float inv_sum = 1.0f / sum;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float g = expf(load(logits, base + v) - max_logit) * inv_sum;
    if (v == target) g -= 1.0f;
    store(dlogits, base + v, g * grad_scale);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// LayerNorm

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    Tensor& out, Tensor& mean, Tensor& rstd) {
  const auto [N, C] = check_layernorm_forward(x, gamma, beta, out, mean, rstd, device());
  if (N == 0) return;

  const int grid = static_cast<int>(ceil_div(N, kWarpsPerBlock));
  // 8 channels per access when every row starts 16-byte aligned in every operand.
  const bool vectorised = C % 8 == 0 && aligned16(x.data()) && aligned16(out.data()) &&
                          aligned16(gamma.data()) && aligned16(beta.data());
  if (vectorised) {
    layernorm_forward_kernel<8><<<grid, kBlock, 0, stream_>>>(as_in(x), as_in(gamma), as_in(beta),
                                                              as_out(out), mean.data_as<float>(),
                                                              rstd.data_as<float>(), N, C);
  } else {
    layernorm_forward_kernel<1><<<grid, kBlock, 0, stream_>>>(as_in(x), as_in(gamma), as_in(beta),
                                                              as_out(out), mean.data_as<float>(),
                                                              rstd.data_as<float>(), N, C);
  }
  MANTISSA_CUDA_CHECK_LAUNCH();
}

void CudaBackend::layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                     const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                     Tensor& dgamma, Tensor& dbeta) {
  const auto [N, C] =
      check_layernorm_backward(dout, x, gamma, mean, rstd, dx, dgamma, dbeta, device());
  if (N == 0) return;

  // dgamma and dbeta first: dx may alias dout.
  const int64_t n_blocks = ceil_div(N, kColumnRowBlock);
  // Freed when this function returns; the allocator's reuse is ordered on this stream.
  Tensor partials = Tensor::empty(Shape{2, n_blocks, C}, DType::kF32, device());
  float* dgamma_partials = partials.data_as<float>();
  float* dbeta_partials = dgamma_partials + n_blocks * C;
  const dim3 partial_grid(static_cast<unsigned>(ceil_div(C, kBlock)),
                          static_cast<unsigned>(std::min<int64_t>(n_blocks, 65535)));
  layernorm_param_partials_kernel<<<partial_grid, kBlock, 0, stream_>>>(
      as_in(dout), as_in(x), mean.data_as<const float>(), rstd.data_as<const float>(), N, C,
      n_blocks, dgamma_partials, dbeta_partials);
  MANTISSA_CUDA_CHECK_LAUNCH();
  add_column_partials(dgamma_partials, n_blocks, C, dgamma.data_as<float>(), multiprocessor_count_,
                      stream_);
  add_column_partials(dbeta_partials, n_blocks, C, dbeta.data_as<float>(), multiprocessor_count_,
                      stream_);

  layernorm_backward_dx_kernel<<<static_cast<int>(ceil_div(N, kWarpsPerBlock)), kBlock, 0,
                                 stream_>>>(as_in(dout), as_in(x), as_in(gamma),
                                            mean.data_as<const float>(),
                                            rstd.data_as<const float>(), as_out(dx), N, C);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------
// Attention

void CudaBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& att, int n_head) {
  const auto [B, T, C, H, D] = check_attention_forward(qkv, out, att, n_head, device());
  const int64_t rows = B * H * T;
  if (rows == 0) return;

  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const AttentionLaunch launch = attention_launch("attention_forward", D);
  // The FP32 probabilities: att itself, or for a BF16 or F16 att a scratch copy freed when
  // this function returns (the allocator's reuse is ordered on this stream).
  Tensor probs =
      att.dtype() == DType::kF32 ? att : Tensor::empty(att.shape(), DType::kF32, device());
  attention_forward_kernel<<<static_cast<int>(ceil_div(rows, launch.warps)),
                             launch.warps * kWarpSize, launch.shared_bytes, stream_>>>(
      as_in(qkv), as_out(out), probs.data_as<float>(), as_out(att), B, T, C, H, D, scale);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

void CudaBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att,
                                     Tensor& dqkv, int n_head) {
  const auto [B, T, C, H, D] = check_attention_backward(dout, qkv, att, dqkv, n_head, device());
  const int64_t rows = B * H * T;
  if (rows == 0) return;

  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  const AttentionLaunch launch = attention_launch("attention_backward", D);
  // The softmax gradients, [B, H, T, T] FP32 like att; freed when this function returns (the
  // allocator's reuse is ordered on this stream).
  Tensor dscores = Tensor::empty(att.shape(), DType::kF32, device());
  attention_backward_query_kernel<<<static_cast<int>(ceil_div(rows, launch.warps)),
                                    launch.warps * kWarpSize, launch.shared_bytes, stream_>>>(
      as_in(dout), as_in(qkv), as_in(att), dscores.data_as<float>(), as_out(dqkv), B, T, C, H, D,
      scale);
  MANTISSA_CUDA_CHECK_LAUNCH();
  attention_backward_key_kernel<<<static_cast<int>(ceil_div(rows, kWarpsPerBlock)), kBlock, 0,
                                  stream_>>>(as_in(dout), as_in(qkv), as_in(att),
                                             dscores.data_as<const float>(), as_out(dqkv), B, T, C,
                                             H, D);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------
// Embeddings

void CudaBackend::embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                    Tensor& out) {
  const auto [B, T, V, C] = check_embedding_forward(tokens, wte, wpe, out, device());
  check_indices("embedding_forward", "token", tokens, V, multiprocessor_count_, stream_);
  if (B * T * C == 0) return;

  embedding_forward_kernel<<<grid_size(B * T * C, kBlock, multiprocessor_count_), kBlock, 0,
                             stream_>>>(tokens.data_as<const int32_t>(), as_in(wte), as_in(wpe),
                                        as_out(out), B * T, T, C);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

void CudaBackend::embedding_backward(const Tensor& dout, const Tensor& tokens, Tensor& dwte,
                                     Tensor& dwpe) {
  const auto [B, T, V, C] = check_embedding_backward(dout, tokens, dwte, dwpe, device());
  check_indices("embedding_backward", "token", tokens, V, multiprocessor_count_, stream_);
  const int64_t BT = B * T;
  if (BT * C == 0) return;

  embedding_backward_wpe_kernel<<<grid_size(T * C, kBlock, multiprocessor_count_), kBlock, 0,
                                  stream_>>>(as_in(dout), dwpe.data_as<float>(), B, T, C);
  MANTISSA_CUDA_CHECK_LAUNCH();

  // Group positions by token: a stable radix sort of (token, position) pairs over just the
  // bits a token in [0, V) can use. Temporaries are freed when this function returns (the
  // allocator's reuse is ordered on this stream).
  Tensor positions = Tensor::empty(Shape{BT}, DType::kI32, device());
  Tensor sorted = Tensor::empty(Shape{2, BT}, DType::kI32, device());
  int32_t* sorted_tokens = sorted.data_as<int32_t>();
  int32_t* sorted_positions = sorted_tokens + BT;
  iota_kernel<<<grid_size(BT, kBlock, multiprocessor_count_), kBlock, 0, stream_>>>(
      positions.data_as<int32_t>(), BT);
  MANTISSA_CUDA_CHECK_LAUNCH();
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) < V) ++end_bit;
  const int num_items = static_cast<int>(BT);
  size_t temp_bytes = 0;
  MANTISSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      nullptr, temp_bytes, tokens.data_as<const int32_t>(), sorted_tokens,
      positions.data_as<const int32_t>(), sorted_positions, num_items, 0, end_bit, stream_));
  Tensor temp = Tensor::empty(Shape{static_cast<int64_t>(temp_bytes)}, DType::kU8, device());
  MANTISSA_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(
      temp.data(), temp_bytes, tokens.data_as<const int32_t>(), sorted_tokens,
      positions.data_as<const int32_t>(), sorted_positions, num_items, 0, end_bit, stream_));

  embedding_backward_wte_kernel<<<static_cast<int>(ceil_div(BT, kWarpsPerBlock)), kBlock, 0,
                                  stream_>>>(as_in(dout), sorted_tokens, sorted_positions,
                                             dwte.data_as<float>(), BT, C);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

// ---------------------------------------------------------------------------------------
// Cross-entropy

void CudaBackend::softmax_cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& losses,
                                        Tensor* dlogits, float grad_scale) {
  const auto [N, V] = check_softmax_cross_entropy(logits, targets, losses, dlogits, device());
  check_indices("softmax_cross_entropy", "target", targets, V, multiprocessor_count_, stream_);
  if (N == 0) return;

  const FloatOut grad = dlogits != nullptr ? as_out(*dlogits) : FloatOut{nullptr, DType::kF32};
  softmax_cross_entropy_kernel<<<static_cast<unsigned>(N), kCrossEntropyBlock, 0, stream_>>>(
      as_in(logits), targets.data_as<const int32_t>(), losses.data_as<float>(), grad, grad_scale,
      V);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
