// RMSNorm on the CPU (the per-element terms are core/ops/math/rmsnorm.h's, shared with the
// CUDA backend): one row of C channels per iteration for the output and dx, blocks of
// channels for dgamma, as cpu_layernorm.cpp does. Operands are read and written as
// cpu_layer_io.h describes.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/int_math.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/math/rmsnorm.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

namespace {

// xh[c] *= rstd in place (xhat), and the row's sum of dnorm xhat with dnorm = dy g: eight lanes
// of FP32 partial sums (channel c in lane c % 8, one fused multiply-add each), the lanes added
// in order, then the last C % 8 channels, as cpu_layernorm.cpp's sums (a scalar sum carried
// one channel at a time was latency-bound).
float xhat_and_dnorm_xhat_sum(float* xh, const float* dy, const float* g, int64_t C, float rstd) {
  const __m256 rstd8 = _mm256_set1_ps(rstd);
  __m256 sum8 = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    const __m256 xhat = _mm256_mul_ps(_mm256_loadu_ps(xh + c), rstd8);
    _mm256_storeu_ps(xh + c, xhat);
    const __m256 dnorm = _mm256_mul_ps(_mm256_loadu_ps(dy + c), _mm256_loadu_ps(g + c));
    sum8 = _mm256_fmadd_ps(dnorm, xhat, sum8);
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum8);
  float sum = 0.0f;
  for (const float lane : lanes) sum += lane;
  for (; c < C; ++c) {
    xh[c] *= rstd;
    sum = std::fma(dy[c] * g[c], xh[c], sum);
  }
  return sum;
}

}  // namespace

// out = x * rstd * gamma with rstd = 1 / sqrt(mean(x^2) + eps) over the C channels of a row.
void CpuBackend::rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& out,
                                 Tensor& rstd) {
  const auto [N, C] = check_rmsnorm_forward(x, gamma, eps, out, rstd, device());

  const std::vector<float> g = load_all(gamma);
  float* rstd_out = rstd.data_as<float>();
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(C));
    float* r = row.data();
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      load(x, n * C, C, r);
      float squares = 0.0f;
#pragma omp simd reduction(+ : squares)
      for (int64_t c = 0; c < C; ++c) squares += r[c] * r[c];
      const float s = rmsnorm_rstd(squares, C, eps);
      for (int64_t c = 0; c < C; ++c) r[c] = rmsnorm_out(r[c], s, g[c]);
      store(r, C, out, n * C);
      rstd_out[n] = s;
    }
  }
}

// With xhat = x * rstd and dnorm = dout * gamma:
//   dx = rstd * (dnorm - xhat * mean(dnorm * xhat)),  dgamma += sum over rows of dout * xhat.
void CpuBackend::rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                  const Tensor& rstd, Tensor& dx, Tensor& dgamma) {
  const auto [N, C] = check_rmsnorm_backward(dout, x, gamma, rstd, dx, dgamma, device());

  const std::vector<float> g = load_all(gamma);
  const float* rstd_in = rstd.data_as<const float>();

  // dgamma first: dx may be dout itself. Each thread owns a block of channels and sums over
  // all rows in order.
  float* dg = dgamma.data_as<float>();
  const int64_t blocks = ceil_div(C, kChannelBlock);
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t c0 = block * kChannelBlock;
    const int64_t width = std::min(kChannelBlock, C - c0);
    float dy[kChannelBlock], xs[kChannelBlock];
    float g_sum[kChannelBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      load(dout, n * C + c0, width, dy);
      load(x, n * C + c0, width, xs);
      const float s = rstd_in[n];
      for (int64_t c = 0; c < width; ++c) g_sum[c] += dy[c] * (xs[c] * s);
    }
    for (int64_t c = 0; c < width; ++c) dg[c0 + c] += g_sum[c];
  }

  // dx, one row per iteration.
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(2 * C));
    float* dy = buffer.data();
    float* xh = dy + C;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      load(dout, n * C, C, dy);
      load(x, n * C, C, xh);
      const float s = rstd_in[n];
      const float dnorm_xhat_mean =
          xhat_and_dnorm_xhat_sum(xh, dy, g.data(), C, s) / static_cast<float>(C);
      for (int64_t c = 0; c < C; ++c) dy[c] = rmsnorm_dx(dy[c] * g[c], xh[c], dnorm_xhat_mean, s);
      store(dy, C, dx, n * C);
    }
  }
}

}  // namespace mantissa::core
