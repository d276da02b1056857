// Grouped-query attention's key/value heads on the GPU; the CPU backend's twin is
// cpu_kv_heads.cpp, and the two agree bit for bit (a copy, and sums over each group in head
// order). One thread per output element, in a grid-stride loop. Operands are read and
// written as cuda_layer_io.cuh describes.
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;

// Rows: grouped q[H] | k[KV] | v[KV] heads, expanded q[H] | k[H] | v[H] heads, D channels
// each; expanded key (value) head h is grouped key (value) head h / group.
__global__ void repeat_kv_heads_kernel(FloatIn qkv, FloatOut out, int64_t H, int64_t KV, int64_t D,
                                       int64_t n) {
  const int64_t out_row = 3 * H * D, in_row = (H + 2 * KV) * D, group = H / KV;
  for (int64_t i = global_thread_index(); i < n; i += grid_stride()) {
    const int64_t bt = i / out_row, c = i % out_row;
    const int64_t part = c / (H * D), h = c % (H * D) / D, d = c % D;
    const int64_t src = part == 0 ? c : H * D + (part - 1) * KV * D + (h / group) * D + d;
    store(out, i, load(qkv, bt * in_row + src));
  }
}

__global__ void repeat_kv_heads_backward_kernel(FloatIn dout, FloatOut dqkv, int64_t H, int64_t KV,
                                                int64_t D, int64_t n) {
  const int64_t out_row = (H + 2 * KV) * D, in_row = 3 * H * D, group = H / KV;
  for (int64_t i = global_thread_index(); i < n; i += grid_stride()) {
    const int64_t bt = i / out_row, c = i % out_row;
    if (c < H * D) {
      store(dqkv, i, load(dout, bt * in_row + c));
      continue;
    }
    const int64_t part = (c - H * D) / (KV * D) + 1;  // 1: keys, 2: values
    const int64_t j = (c - H * D) % (KV * D) / D, d = c % D;
    float sum = 0.0f;
    for (int64_t g = 0; g < group; ++g) {
      sum += load(dout, bt * in_row + part * H * D + (j * group + g) * D + d);
    }
    store(dqkv, i, sum);
  }
}

}  // namespace

void CudaBackend::repeat_kv_heads(const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                  Tensor& out) {
  const auto [B, T, H, KV, D] = check_repeat_kv_heads(qkv, n_head, n_kv_head, out, device());
  const int64_t n = out.numel();
  if (n == 0) return;
  repeat_kv_heads_kernel<<<grid_size(n, kBlock, multiprocessor_count_), kBlock, 0, stream()>>>(
      as_in(qkv), as_out(out), H, KV, D, n);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

void CudaBackend::repeat_kv_heads_backward(const Tensor& dout, int64_t n_head, int64_t n_kv_head,
                                           Tensor& dqkv) {
  const auto [B, T, H, KV, D] =
      check_repeat_kv_heads_backward(dout, n_head, n_kv_head, dqkv, device());
  const int64_t n = dqkv.numel();
  if (n == 0) return;
  repeat_kv_heads_backward_kernel<<<grid_size(n, kBlock, multiprocessor_count_), kBlock, 0,
                                    stream()>>>(as_in(dout), as_out(dqkv), H, KV, D, n);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
