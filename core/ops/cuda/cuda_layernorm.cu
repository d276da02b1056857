// LayerNorm on the GPU: the per-element terms are core/ops/math/layernorm.h's, the CPU
// backend's (cpu_layernorm.cpp); FP32 internally, one rounding to nearest even per stored
// value. Operands are read and written as cuda_layer_io.cuh describes.
//
// Determinism: no kernel here uses floating-point atomics; dgamma and dbeta are reduced in a
// fixed order, by fixed blocks of rows (cuda_kernel_utils.cuh).
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/math/layernorm.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;
constexpr int kWarpsPerBlock = kBlock / kWarpSize;

// LayerNorm forward: one warp per row of x[N, C].
//   mean = sum(x) / C,  var = sum((x - mean)^2) / C (two passes: no E[x^2] - E[x]^2
//   cancellation),  rstd = 1 / sqrt(var + eps),  out = (x - mean) * rstd * gamma + beta.
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
  const float s = layernorm_rstd(warp_sum(squares), C);

  for (int64_t c = lane * W; c < C; c += kWarpSize * W) {
    float v[W], g[W], b[W];
    load_chunk<W>(x, base + c, v);
    load_chunk<W>(gamma, c, g);
    load_chunk<W>(beta, c, b);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = layernorm_out(v[k], m, s, g[k], b[k]);
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
    const float xhat = layernorm_xhat(load(x, base + c), m, s);
    const float dnorm = load(dout, base + c) * load(gamma, c);
    dnorm_sum += dnorm;
    dnorm_xhat_sum += dnorm * xhat;
  }
  const float dnorm_mean = warp_sum(dnorm_sum) / static_cast<float>(C);
  const float dnorm_xhat_mean = warp_sum(dnorm_xhat_sum) / static_cast<float>(C);

  for (int64_t c = lane; c < C; c += kWarpSize) {
    const float xhat = layernorm_xhat(load(x, base + c), m, s);
    const float dnorm = load(dout, base + c) * load(gamma, c);
    store(dx, base + c, layernorm_dx(dnorm, xhat, dnorm_mean, dnorm_xhat_mean, s));
  }
}

// LayerNorm backward, first stage of dgamma += sum over rows of dout * xhat and
// dbeta += sum over rows of dout: per (column, block of kColumnRowBlock rows) partial sums,
// finished by add_column_partials. Consecutive threads take consecutive columns (coalesced);
// each thread loads kColumnRowsInFlight rows before adding them in row order (one memory
// latency per that many rows; see kColumnThreads).
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
    int64_t r = block * kColumnRowBlock;
    for (; r + kColumnRowsInFlight <= row_end; r += kColumnRowsInFlight) {
      float dy[kColumnRowsInFlight], xv[kColumnRowsInFlight];
#pragma unroll
      for (int u = 0; u < kColumnRowsInFlight; ++u) {
        dy[u] = load(dout, (r + u) * C + c);
        xv[u] = load(x, (r + u) * C + c);
      }
#pragma unroll
      for (int u = 0; u < kColumnRowsInFlight; ++u) {
        g_sum += dy[u] * layernorm_xhat(xv[u], mean[r + u], rstd[r + u]);
        b_sum += dy[u];
      }
    }
    for (; r < row_end; ++r) {
      const float dy = load(dout, r * C + c);
      g_sum += dy * layernorm_xhat(load(x, r * C + c), mean[r], rstd[r]);
      b_sum += dy;
    }
    dgamma_partials[block * C + c] = g_sum;
    dbeta_partials[block * C + c] = b_sum;
  }
}

}  // namespace

void CudaBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                    Tensor& out, Tensor& mean, Tensor& rstd) {
  const auto [N, C] = check_layernorm_forward(x, gamma, beta, out, mean, rstd, device());
  if (N == 0) return;

  const int grid = static_cast<int>(ceil_div(N, kWarpsPerBlock));
  // 8 channels per access when every row starts 16-byte aligned in every operand.
  const bool vectorised = C % 8 == 0 && aligned16(x.data()) && aligned16(out.data()) &&
                          aligned16(gamma.data()) && aligned16(beta.data());
  if (vectorised) {
    layernorm_forward_kernel<8><<<grid, kBlock, 0, stream()>>>(as_in(x), as_in(gamma), as_in(beta),
                                                               as_out(out), mean.data_as<float>(),
                                                               rstd.data_as<float>(), N, C);
  } else {
    layernorm_forward_kernel<1><<<grid, kBlock, 0, stream()>>>(as_in(x), as_in(gamma), as_in(beta),
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
  const dim3 partial_grid(static_cast<unsigned>(ceil_div(C, kColumnThreads)),
                          static_cast<unsigned>(std::min<int64_t>(n_blocks, 65535)));
  layernorm_param_partials_kernel<<<partial_grid, kColumnThreads, 0, stream()>>>(
      as_in(dout), as_in(x), mean.data_as<const float>(), rstd.data_as<const float>(), N, C,
      n_blocks, dgamma_partials, dbeta_partials);
  MANTISSA_CUDA_CHECK_LAUNCH();
  add_column_partials(dgamma_partials, n_blocks, C, dgamma.data_as<float>(), multiprocessor_count_,
                      stream());
  add_column_partials(dbeta_partials, n_blocks, C, dbeta.data_as<float>(), multiprocessor_count_,
                      stream());

  layernorm_backward_dx_kernel<<<static_cast<int>(ceil_div(N, kWarpsPerBlock)), kBlock, 0,
                                 stream()>>>(as_in(dout), as_in(x), as_in(gamma),
                                             mean.data_as<const float>(),
                                             rstd.data_as<const float>(), as_out(dx), N, C);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
