// RMSNorm on the GPU: the per-element terms are core/ops/math/rmsnorm.h's, the CPU backend's
// (cpu_rmsnorm.cpp); FP32 internally, one rounding to nearest even per stored value. Operands
// are read and written as cuda_layer_io.cuh describes. The kernels follow cuda_layernorm.cu's.
//
// Determinism: no kernel here uses floating-point atomics; dgamma is reduced in a fixed order,
// by fixed blocks of rows (cuda_kernel_utils.cuh).
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/math/rmsnorm.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarpSize;

// RMSNorm forward: one warp per row of x[N, C].
//   rstd = 1 / sqrt(sum(x^2) / C + eps),  out = x * rstd * gamma.
// Each lane takes W consecutive channels at a time (W = 8: 16-byte accesses); the second read
// of the row hits in L1/L2.
template <int W>
__global__ void rmsnorm_forward_kernel(FloatIn x, FloatIn gamma, FloatOut y,
                                       float* __restrict__ rstd, int64_t rows, int64_t C,
                                       float eps) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;  // the whole warp leaves together
  const int64_t base = row * C;

  float squares = 0.0f;
  for (int64_t c = lane * W; c < C; c += kWarpSize * W) {
    float v[W];
    load_chunk<W>(x, base + c, v);
#pragma unroll
    for (int k = 0; k < W; ++k) squares += v[k] * v[k];
  }
  const float s = rmsnorm_rstd(warp_sum(squares), C, eps);

  for (int64_t c = lane * W; c < C; c += kWarpSize * W) {
    float v[W], g[W];
    load_chunk<W>(x, base + c, v);
    load_chunk<W>(gamma, c, g);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = rmsnorm_out(v[k], s, g[k]);
    store_chunk<W>(y, base + c, v);
  }
  if (lane == 0) rstd[row] = s;
}

// RMSNorm backward, dx: one warp per row. With xhat = x * rstd and dnorm = dout * gamma:
//   dx = rstd * (dnorm - xhat * mean(dnorm * xhat)).
// Each lane reads a channel of dout before it writes the same channel of dx, so dx may be
// dout itself.
__global__ void rmsnorm_backward_dx_kernel(FloatIn dout, FloatIn x, FloatIn gamma,
                                           const float* __restrict__ rstd, FloatOut dx,
                                           int64_t rows, int64_t C) {
  const int lane = threadIdx.x % kWarpSize;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarpSize;
  if (row >= rows) return;
  const int64_t base = row * C;
  const float s = rstd[row];

  float dnorm_xhat_sum = 0.0f;
  for (int64_t c = lane; c < C; c += kWarpSize) {
    dnorm_xhat_sum += load(dout, base + c) * load(gamma, c) * (load(x, base + c) * s);
  }
  const float dnorm_xhat_mean = warp_sum(dnorm_xhat_sum) / static_cast<float>(C);

  for (int64_t c = lane; c < C; c += kWarpSize) {
    const float dnorm = load(dout, base + c) * load(gamma, c);
    store(dx, base + c, rmsnorm_dx(dnorm, load(x, base + c) * s, dnorm_xhat_mean, s));
  }
}

// RMSNorm backward, first stage of dgamma += sum over rows of dout * xhat: per (column, block
// of kColumnRowBlock rows) partial sums, finished by add_column_partials. Consecutive threads
// take consecutive columns (coalesced).
__global__ void rmsnorm_dgamma_partials_kernel(FloatIn dout, FloatIn x,
                                               const float* __restrict__ rstd, int64_t rows,
                                               int64_t C, int64_t n_blocks,
                                               float* __restrict__ partials) {
  const int64_t c = global_thread_index();
  if (c >= C) return;
  for (int64_t block = blockIdx.y; block < n_blocks; block += gridDim.y) {
    const int64_t row_end = min(rows, (block + 1) * kColumnRowBlock);
    float sum = 0.0f;
    for (int64_t r = block * kColumnRowBlock; r < row_end; ++r) {
      sum += load(dout, r * C + c) * (load(x, r * C + c) * rstd[r]);
    }
    partials[block * C + c] = sum;
  }
}

}  // namespace

void CudaBackend::rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& out,
                                  Tensor& rstd) {
  const auto [N, C] = check_rmsnorm_forward(x, gamma, eps, out, rstd, device());
  if (N == 0) return;

  const int grid = static_cast<int>(ceil_div(N, kWarpsPerBlock));
  // 8 channels per access when every row starts 16-byte aligned in every operand.
  const bool vectorised =
      C % 8 == 0 && aligned16(x.data()) && aligned16(out.data()) && aligned16(gamma.data());
  if (vectorised) {
    rmsnorm_forward_kernel<8><<<grid, kBlock, 0, stream()>>>(as_in(x), as_in(gamma), as_out(out),
                                                             rstd.data_as<float>(), N, C, eps);
  } else {
    rmsnorm_forward_kernel<1><<<grid, kBlock, 0, stream()>>>(as_in(x), as_in(gamma), as_out(out),
                                                             rstd.data_as<float>(), N, C, eps);
  }
  MANTISSA_CUDA_CHECK_LAUNCH();
}

void CudaBackend::rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                   const Tensor& rstd, Tensor& dx, Tensor& dgamma) {
  const auto [N, C] = check_rmsnorm_backward(dout, x, gamma, rstd, dx, dgamma, device());
  if (N == 0) return;

  // dgamma first: dx may be dout itself.
  const int64_t n_blocks = ceil_div(N, kColumnRowBlock);
  // Freed when this function returns; the allocator's reuse is ordered on this stream.
  Tensor partials = Tensor::empty(Shape{n_blocks, C}, DType::kF32, device());
  const dim3 partial_grid(static_cast<unsigned>(ceil_div(C, kBlock)),
                          static_cast<unsigned>(std::min<int64_t>(n_blocks, 65535)));
  rmsnorm_dgamma_partials_kernel<<<partial_grid, kBlock, 0, stream()>>>(
      as_in(dout), as_in(x), rstd.data_as<const float>(), N, C, n_blocks,
      partials.data_as<float>());
  MANTISSA_CUDA_CHECK_LAUNCH();
  add_column_partials(partials.data_as<const float>(), n_blocks, C, dgamma.data_as<float>(),
                      multiprocessor_count_, stream());

  rmsnorm_backward_dx_kernel<<<static_cast<int>(ceil_div(N, kWarpsPerBlock)), kBlock, 0,
                               stream()>>>(as_in(dout), as_in(x), as_in(gamma),
                                           rstd.data_as<const float>(), as_out(dx), N, C);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
