// SwiGLU on the GPU: the per-element math is core/ops/math/swiglu.h's, the CPU backend's
// (cpu_swiglu.cpp), so the two agree bit for bit. One thread per (row, j) of out[N, I], in a
// grid-stride loop; in the backward the thread reads gate and up before it writes their
// gradients, so dgate_up may be gate_up itself. Operands are read and written as
// cuda_layer_io.cuh describes.
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/math/swiglu.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;

__global__ void swiglu_forward_kernel(FloatIn gate_up, FloatOut out, int64_t I, int64_t n) {
  for (int64_t k = global_thread_index(); k < n; k += grid_stride()) {
    const int64_t row = k / I;
    const int64_t j = k % I;
    const int64_t g = row * 2 * I + j;
    store(out, k, swiglu_out(load(gate_up, g), load(gate_up, g + I)));
  }
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate).
__global__ void swiglu_backward_kernel(FloatIn dout, FloatIn gate_up, FloatOut dgate_up, int64_t I,
                                       int64_t n) {
  for (int64_t k = global_thread_index(); k < n; k += grid_stride()) {
    const int64_t row = k / I;
    const int64_t j = k % I;
    const int64_t gi = row * 2 * I + j;
    const float g = load(gate_up, gi);
    const float u = load(gate_up, gi + I);
    const float dy = load(dout, k);
    store(dgate_up, gi, dy * u * silu_grad(g));
    store(dgate_up, gi + I, dy * silu(g));
  }
}

}  // namespace

void CudaBackend::swiglu_forward(const Tensor& gate_up, Tensor& out) {
  const auto [N, I] = check_swiglu_forward(gate_up, out, device());
  const int64_t n = N * I;
  if (n == 0) return;
  swiglu_forward_kernel<<<grid_size(n, kBlock, multiprocessor_count_), kBlock, 0, stream()>>>(
      as_in(gate_up), as_out(out), I, n);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

void CudaBackend::swiglu_backward(const Tensor& dout, const Tensor& gate_up, Tensor& dgate_up) {
  const auto [N, I] = check_swiglu_backward(dout, gate_up, dgate_up, device());
  const int64_t n = N * I;
  if (n == 0) return;
  swiglu_backward_kernel<<<grid_size(n, kBlock, multiprocessor_count_), kBlock, 0, stream()>>>(
      as_in(dout), as_in(gate_up), as_out(dgate_up), I, n);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
