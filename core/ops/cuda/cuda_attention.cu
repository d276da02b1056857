// Causal self-attention on the GPU: the softmax pieces are core/ops/math/softmax.h's, the CPU
// backend's (cpu_attention.cpp); FP32 internally, one rounding to nearest even per stored
// value. Operands are read and written as cuda_layer_io.cuh describes. No kernel here uses
// floating-point atomics.
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarpSize;

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
    max_score = softmax_max(max_score, score);
  }
  __syncwarp();  // lane 0's scores become visible to the whole warp

  float sum = 0.0f;
  for (int64_t t2 = lane; t2 <= t; t2 += kWarpSize) {
    const float e = softmax_exp(p[t2], max_score);
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
    ds[t2] = softmax_backward(load(att, p_row + t2), ds[t2], p_dp) * scale;
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

}  // namespace

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

}  // namespace mantissa::core
