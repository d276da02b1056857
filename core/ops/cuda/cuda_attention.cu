// Causal self-attention on the GPU: core/ops/attention.h's composed routine, whose products
// are cuBLASLt strided-batched GEMMs over the B*H heads, and its primitives, defined here:
// the head permutations and the causal softmax with its backward (the CPU twins are in
// cpu_attention_primitives.cpp). FP32 math, one rounding to nearest even per stored value;
// the softmax pieces are core/ops/math/softmax.h's. No kernel here uses atomics.
//
// All of them are memory-bound: each moves every element of its operands once through
// DRAM, in 16-byte accesses where the shapes and pointers allow it.
#include <type_traits>

#include "core/ops/attention.h"
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
// Elements per 16-byte access of a BF16 or F16 operand (two accesses for F32).
constexpr int kVector = 8;

// ---------------------------------------------------------------------------------------
// Head permutations: rows[B, T, P*H*D] <-> heads[P, B, H, T, D]. Each thread moves W
// consecutive channels of one head (W = kVector when D and both pointers allow 16-byte
// accesses), indexed by its place in the heads layout, so the heads side is read or written
// contiguously across the warp and the rows side in runs of D channels. Same dtypes are
// copied bit for bit (NaN payloads included), others widened to FP32 and rounded once.
struct HeadsShape {
  int64_t P, B, H, T, D;
};

template <int W, class TI, class TO>
__device__ __forceinline__ void move(const TI* __restrict__ src, TO* __restrict__ dst) {
  if constexpr (std::is_same_v<TI, TO>) {
    if constexpr (W == 1) {
      *dst = *src;
    } else {
      store_pack<W>(dst, load_pack<W>(src));
    }
  } else {
    float v[W];
    load_as_float<W>(src, v);
    store_from_float<W>(dst, v);
  }
}

template <int W, class TI, class TO>
__global__ void permute_heads_kernel(const TI* __restrict__ src, TO* __restrict__ dst, HeadsShape s,
                                     bool to_heads) {
  const int64_t chunks = s.P * s.B * s.H * s.T * s.D / W;
  for (int64_t i = global_thread_index(); i < chunks; i += grid_stride()) {
    const int64_t e = i * W;  // heads[p, b, h, t, d]
    const int64_t d = e % s.D;
    int64_t rest = e / s.D;
    const int64_t t = rest % s.T;
    rest /= s.T;
    const int64_t h = rest % s.H;
    rest /= s.H;
    const int64_t b = rest % s.B;
    const int64_t p = rest / s.B;
    const int64_t r = ((b * s.T + t) * s.P + p) * s.H * s.D + h * s.D + d;  // rows[b, t, .]
    if (to_heads) {
      move<W>(src + r, dst + e);
    } else {
      move<W>(src + e, dst + r);
    }
  }
}

void permute_heads(const Tensor& src, Tensor& dst, const HeadsDims& d, bool to_heads,
                   int multiprocessor_count, cudaStream_t stream) {
  const HeadsShape s{d.P, d.B, d.H, d.T, d.D};
  const int64_t n = src.numel();
  if (n == 0) return;
  const bool vector = d.D % kVector == 0 && aligned16(src.data()) && aligned16(dst.data());
  const char* op = to_heads ? "split_heads" : "merge_heads";
  dispatch_f32_bf16_f16(op, src.dtype(), [&](auto in) {
    using TI = decltype(in);
    dispatch_f32_bf16_f16(op, dst.dtype(), [&](auto out) {
      using TO = decltype(out);
      const TI* from = src.data_as<const TI>();
      TO* to = dst.data_as<TO>();
      if (vector) {
        permute_heads_kernel<kVector>
            <<<grid_size(n / kVector, kBlock, multiprocessor_count), kBlock, 0, stream>>>(
                from, to, s, to_heads);
      } else {
        permute_heads_kernel<1><<<grid_size(n, kBlock, multiprocessor_count), kBlock, 0, stream>>>(
            from, to, s, to_heads);
      }
      MANTISSA_CUDA_CHECK_LAUNCH();
    });
  });
}

// ---------------------------------------------------------------------------------------
// Causal softmax: one warp per row of the N*T rows, row (n, t) seeing its first t + 1
// columns. Lanes take chunks of W columns in turn (W = kVector: 16-byte loads when T and the
// pointers allow them). Blocks take the rows last first: the longest rows start first and
// the short ones fill the tail of the grid.

// The row a warp handles, or -1 past the end.
__device__ __forceinline__ int64_t softmax_row(int64_t rows) {
  const int64_t k = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  return k < rows ? rows - 1 - k : -1;
}

__device__ __forceinline__ SoftmaxState warp_softmax_merge(SoftmaxState s) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const SoftmaxState other{__shfl_xor_sync(0xFFFFFFFFu, s.max, offset),
                             __shfl_xor_sync(0xFFFFFFFFu, s.sum, offset)};
    s = softmax_merge(s, other);
  }
  return s;
}

// Forward, llm.c's softmax_forward_kernel5 in form: one pass finds the maximum and the sum
// together (the online form of softmax.h, chunk by chunk, then merged across the warp), a
// second pass recomputes each exp(z - max) (cheaper than storing it), normalises and writes
// the whole row, zeros past the diagonal included. The second pass re-reads the row from L1
// or L2, so DRAM sees each visible score read once and each probability written once. The
// merge order is fixed by the lane layout, so results are deterministic. probs may be scores
// (each element is read before the same lane writes it).
template <int W>
__global__ void causal_softmax_forward_kernel(FloatIn scores, FloatOut probs, int64_t rows,
                                              int64_t T, float scale) {
  const int64_t row = softmax_row(rows);
  if (row < 0) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = row % T + 1;  // visible columns
  const int64_t base = row * T;
  constexpr int64_t kStride = static_cast<int64_t>(kWarpSize) * W;

  // Each chunk becomes one state {its maximum, its terms relative to that maximum} merged
  // into the lane's: (W + 2) exps per W columns instead of 3 W term by term.
  SoftmaxState state{-INFINITY, 0.0f};
  for (int64_t j = static_cast<int64_t>(lane) * W; j < n; j += kStride) {
    float z[W];
    load_chunk<W>(scores, base + j, z);  // a chunk that starts visible lies within the row
    float chunk_max = -INFINITY;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      z[k] *= scale;
      if (j + k < n) chunk_max = softmax_max(chunk_max, z[k]);
    }
    float chunk_sum = 0.0f;
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (j + k < n) chunk_sum += softmax_rescale(z[k], chunk_max);
    }
    state = softmax_merge(state, {chunk_max, chunk_sum});
  }
  state = warp_softmax_merge(state);
  const float inv_sum = 1.0f / state.sum;

  for (int64_t j = static_cast<int64_t>(lane) * W; j < T; j += kStride) {
    float v[W] = {};
    if (j < n) load_chunk<W>(scores, base + j, v);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      v[k] = j + k < n ? softmax_exp(v[k] * scale, state.max) * inv_sum : 0.0f;
    }
    store_chunk<W>(probs, base + j, v);
  }
}

// Backward: a first pass sums P dP over the visible columns (lane by lane, then across the
// warp), a second re-reads P and dP (from L1 or L2) and writes the whole row of dS, zeros
// past the diagonal. dscores may be dprobs (each element is read before the same lane
// writes it, and the whole first pass ends, at the warp sum, before any write).
template <int W>
__global__ void causal_softmax_backward_kernel(FloatIn probs, FloatIn dprobs, FloatOut dscores,
                                               int64_t rows, int64_t T, float scale) {
  const int64_t row = softmax_row(rows);
  if (row < 0) return;
  const int lane = threadIdx.x % kWarpSize;
  const int64_t n = row % T + 1;
  const int64_t base = row * T;
  constexpr int64_t kStride = static_cast<int64_t>(kWarpSize) * W;

  float p_dp = 0.0f;
  for (int64_t j = static_cast<int64_t>(lane) * W; j < n; j += kStride) {
    float p[W], dp[W];
    load_chunk<W>(probs, base + j, p);
    load_chunk<W>(dprobs, base + j, dp);
#pragma unroll
    for (int k = 0; k < W; ++k) {
      if (j + k < n) p_dp += p[k] * dp[k];
    }
  }
  p_dp = warp_sum(p_dp);

  for (int64_t j = static_cast<int64_t>(lane) * W; j < T; j += kStride) {
    float p[W] = {}, g[W] = {};
    if (j < n) {
      load_chunk<W>(probs, base + j, p);
      load_chunk<W>(dprobs, base + j, g);
    }
#pragma unroll
    for (int k = 0; k < W; ++k)
      g[k] = j + k < n ? softmax_backward(p[k], g[k], p_dp) * scale : 0.0f;
    store_chunk<W>(dscores, base + j, g);
  }
}

// 16-byte chunks need rows of a whole number of chunks and aligned operands.
bool vector_rows(int64_t T, std::initializer_list<const void*> pointers) {
  if (T % kVector != 0) return false;
  for (const void* p : pointers) {
    if (!aligned16(p)) return false;
  }
  return true;
}

unsigned softmax_blocks(int64_t rows) {
  return static_cast<unsigned>(ceil_div(rows, kWarpsPerBlock));
}

}  // namespace

void CudaBackend::attention_forward(const Tensor& qkv, Tensor& out, Tensor& att, int n_head) {
  composed_attention_forward(*this, qkv, out, att, n_head);
}

void CudaBackend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att,
                                     Tensor& dqkv, int n_head) {
  composed_attention_backward(*this, dout, qkv, att, dqkv, n_head);
}

void CudaBackend::split_heads(const Tensor& x, Tensor& out) {
  const HeadsDims d = check_split_heads(x, out, device());
  permute_heads(x, out, d, true, multiprocessor_count_, stream());
}

void CudaBackend::merge_heads(const Tensor& x, Tensor& out) {
  const HeadsDims d = check_merge_heads(x, out, device());
  permute_heads(x, out, d, false, multiprocessor_count_, stream());
}

void CudaBackend::causal_softmax_forward(const Tensor& scores, float scale, Tensor& probs) {
  const auto [N, T] = check_causal_softmax_forward(scores, scale, probs, device());
  const int64_t rows = N * T;
  if (rows == 0) return;
  if (vector_rows(T, {scores.data(), probs.data()})) {
    causal_softmax_forward_kernel<kVector><<<softmax_blocks(rows), kBlock, 0, stream()>>>(
        as_in(scores), as_out(probs), rows, T, scale);
  } else {
    causal_softmax_forward_kernel<1><<<softmax_blocks(rows), kBlock, 0, stream()>>>(
        as_in(scores), as_out(probs), rows, T, scale);
  }
  MANTISSA_CUDA_CHECK_LAUNCH();
}

void CudaBackend::causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale,
                                          Tensor& dscores) {
  const auto [N, T] = check_causal_softmax_backward(probs, dprobs, scale, dscores, device());
  const int64_t rows = N * T;
  if (rows == 0) return;
  if (vector_rows(T, {probs.data(), dprobs.data(), dscores.data()})) {
    causal_softmax_backward_kernel<kVector><<<softmax_blocks(rows), kBlock, 0, stream()>>>(
        as_in(probs), as_in(dprobs), as_out(dscores), rows, T, scale);
  } else {
    causal_softmax_backward_kernel<1><<<softmax_blocks(rows), kBlock, 0, stream()>>>(
        as_in(probs), as_in(dprobs), as_out(dscores), rows, T, scale);
  }
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
