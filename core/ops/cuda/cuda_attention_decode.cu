// Causal attention of new positions over a KV cache on the GPU (Backend::attention_decode), the
// step of text generation: the CPU backend's math (cpu_attention_decode.cpp) with the softmax
// pieces of core/ops/math/softmax.h, FP32 internally, one rounding to nearest even per stored
// value. Operands are read and written as cuda_layer_io.cuh describes. A simple kernel: one
// generation step reads every cached key and value once per head, a few megabytes at most, so
// the weights' GEMMs dominate it, not this.
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 128;

// The K and V of new row i (qkv[i, C:2C] and qkv[i, 2C:3C]) into cache row first + i.
__global__ void append_kv_kernel(FloatIn qkv, FloatOut k_cache, FloatOut v_cache, int64_t N,
                                 int64_t C, int64_t first) {
  for (int64_t e = global_thread_index(); e < N * C; e += grid_stride()) {
    const int64_t i = e / C, c = e % C;
    store(k_cache, (first + i) * C + c, load(qkv, i * 3 * C + C + c));
    store(v_cache, (first + i) * C + c, load(qkv, i * 3 * C + 2 * C + c));
  }
}

// One block per (new row i, head h), at position p = first + i. With scale = 1 / sqrt(D):
//   s[t] = scale q . k_t  for t <= p   (threads over keys, each summing its channels in order)
//   P    = softmax(s)                  (FP32; block max and sum)
//   o    = sum_t P[t] v_t              (threads over channels, keys in order)
// Dynamic shared memory holds q (D floats) and the scores (p + 1 floats).
__global__ void attention_decode_kernel(FloatIn qkv, FloatIn k_cache, FloatIn v_cache, FloatOut out,
                                        int64_t C, int64_t H, int64_t D, int64_t first,
                                        float scale) {
  extern __shared__ float shared[];
  float* q = shared;
  float* p = shared + D;
  const int64_t i = blockIdx.x / H, h = blockIdx.x % H;
  const int64_t n = first + i + 1;  // visible positions
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) q[d] = load(qkv, i * 3 * C + h * D + d);
  __syncthreads();

  float local_max = -INFINITY;
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
    float score = 0.0f;
    for (int64_t d = 0; d < D; ++d) score += q[d] * load(k_cache, t * C + h * D + d);
    p[t] = score * scale;
    // A NaN score never wins the comparison but still turns the sum, hence the row, NaN.
    local_max = softmax_max(local_max, p[t]);
  }
  const float max_score = block_max(local_max);
  float local_sum = 0.0f;
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) {
    p[t] = softmax_exp(p[t], max_score);
    local_sum += p[t];
  }
  const float inv_sum = 1.0f / block_sum(local_sum);
  for (int64_t t = threadIdx.x; t < n; t += blockDim.x) p[t] *= inv_sum;
  __syncthreads();  // every probability is read by every thread below

  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int64_t t = 0; t < n; ++t) o += p[t] * load(v_cache, t * C + h * D + d);
    store(out, i * C + h * D + d, o);
  }
}

}  // namespace

void CudaBackend::attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                                   int n_head, int64_t start) {
  const auto [N, S, C, H, D, first] =
      check_attention_decode(qkv, k_cache, v_cache, out, n_head, start, device());
  if (N == 0) return;

  // q and the scores of the last new row, in dynamic shared memory: up to the device's opt-in
  // limit less the kernel's static shared memory (the block reductions' partials). Above the
  // default 48 KiB the kernel opts in; Hopper then holds about 58,000 positions.
  cudaFuncAttributes attributes{};
  MANTISSA_CUDA_CHECK(cudaFuncGetAttributes(&attributes, attention_decode_kernel));
  const int64_t max_shared_bytes =
      max_shared_per_block_ - static_cast<int64_t>(attributes.sharedSizeBytes);
  const int64_t shared_bytes = (D + first + N) * static_cast<int64_t>(sizeof(float));
  MANTISSA_CHECK(shared_bytes <= max_shared_bytes,
                 "attention_decode: head size "
                     << D << " plus " << first + N
                     << " positions is above the CUDA backend's limit of "
                     << max_shared_bytes / static_cast<int64_t>(sizeof(float)) << " floats");
  if (shared_bytes > attributes.maxDynamicSharedSizeBytes) {
    allow_shared_bytes(attention_decode_kernel, static_cast<size_t>(shared_bytes));
  }
  append_kv_kernel<<<grid_size(N * C, kBlock, multiprocessor_count_), kBlock, 0, stream()>>>(
      as_in(qkv), as_out(k_cache), as_out(v_cache), N, C, first);
  MANTISSA_CUDA_CHECK_LAUNCH();
  const float scale = attention_scale(D);
  attention_decode_kernel<<<static_cast<int>(N * H), kBlock, static_cast<size_t>(shared_bytes),
                            stream()>>>(as_in(qkv), as_in(k_cache), as_in(v_cache), as_out(out), C,
                                        H, D, first, scale);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
