// LayerNorm on the CPU (the math follows llm.c's train_gpt2.c; the per-element terms are
// core/ops/math/layernorm.h's, shared with the CUDA backend): one row of C channels per
// iteration for the output and dx, blocks of channels for dgamma and dbeta. Operands are read
// and written as cpu_layer_io.h describes.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/int_math.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/math/layernorm.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

// out = (x - mean) * rstd * gamma + beta with rstd = 1 / sqrt(var + eps), the biased variance
// over the C channels of each row.
void CpuBackend::layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                   Tensor& out, Tensor& mean, Tensor& rstd) {
  const auto [N, C] = check_layernorm_forward(x, gamma, beta, out, mean, rstd, device());

  const std::vector<float> g = load_all(gamma);
  const std::vector<float> b = load_all(beta);
  float* mean_out = mean.data_as<float>();
  float* rstd_out = rstd.data_as<float>();
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(C));
    float* r = row.data();
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      load(x, n * C, C, r);
      // Two passes (mean, then squared deviations) avoid the cancellation of E[x^2] - E[x]^2.
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t c = 0; c < C; ++c) sum += r[c];
      const float m = sum / static_cast<float>(C);
      float sq = 0.0f;
#pragma omp simd reduction(+ : sq)
      for (int64_t c = 0; c < C; ++c) sq += (r[c] - m) * (r[c] - m);
      const float s = layernorm_rstd(sq, C);
      for (int64_t c = 0; c < C; ++c) r[c] = layernorm_out(r[c], m, s, g[c], b[c]);
      store(r, C, out, n * C);
      mean_out[n] = m;
      rstd_out[n] = s;
    }
  }
}

namespace {

struct DnormSums {
  float dnorm, dnorm_xhat;
};

// xh[c] = layernorm_xhat(xh[c], mean, rstd) in place, and the row's sums of dnorm = dy g and of
// dnorm xhat: eight lanes of FP32 partial sums (channel c in lane c % 8, dnorm xhat added by
// one fused multiply-add), the lanes added in order, then the last C % 8 channels. Scalar
// sums carried one channel at a time would wait for each addition: the loop was latency-bound.
DnormSums xhat_and_dnorm_sums(float* xh, const float* dy, const float* g, int64_t C, float mean,
                              float rstd) {
  const __m256 mean8 = _mm256_set1_ps(mean), rstd8 = _mm256_set1_ps(rstd);
  __m256 dnorm8 = _mm256_setzero_ps(), dnorm_xhat8 = _mm256_setzero_ps();
  int64_t c = 0;
  for (; c + 8 <= C; c += 8) {
    const __m256 xhat = _mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(xh + c), mean8), rstd8);
    _mm256_storeu_ps(xh + c, xhat);
    const __m256 dnorm = _mm256_mul_ps(_mm256_loadu_ps(dy + c), _mm256_loadu_ps(g + c));
    dnorm8 = _mm256_add_ps(dnorm8, dnorm);
    dnorm_xhat8 = _mm256_fmadd_ps(dnorm, xhat, dnorm_xhat8);
  }
  alignas(32) float dnorm_lanes[8], dnorm_xhat_lanes[8];
  _mm256_store_ps(dnorm_lanes, dnorm8);
  _mm256_store_ps(dnorm_xhat_lanes, dnorm_xhat8);
  DnormSums sums{0.0f, 0.0f};
  for (int l = 0; l < 8; ++l) {
    sums.dnorm += dnorm_lanes[l];
    sums.dnorm_xhat += dnorm_xhat_lanes[l];
  }
  for (; c < C; ++c) {
    xh[c] = layernorm_xhat(xh[c], mean, rstd);
    const float dnorm = dy[c] * g[c];
    sums.dnorm += dnorm;
    sums.dnorm_xhat = std::fma(dnorm, xh[c], sums.dnorm_xhat);
  }
  return sums;
}

}  // namespace

// With xhat = (x - mean) * rstd and y = xhat * gamma + beta, and dnorm = dout * gamma:
//   dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
//   dgamma += sum over rows of dout * xhat,  dbeta += sum over rows of dout.
void CpuBackend::layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                    const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                    Tensor& dgamma, Tensor& dbeta) {
  const auto [N, C] =
      check_layernorm_backward(dout, x, gamma, mean, rstd, dx, dgamma, dbeta, device());

  const std::vector<float> g = load_all(gamma);
  const float* mean_in = mean.data_as<const float>();
  const float* rstd_in = rstd.data_as<const float>();

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
      const DnormSums sums = xhat_and_dnorm_sums(xh, dy, g.data(), C, mean_in[n], s);
      const float dnorm_mean = sums.dnorm / static_cast<float>(C);
      const float dnorm_xhat_mean = sums.dnorm_xhat / static_cast<float>(C);
      for (int64_t c = 0; c < C; ++c) {
        dy[c] = layernorm_dx(dy[c] * g[c], xh[c], dnorm_mean, dnorm_xhat_mean, s);
      }
      store(dy, C, dx, n * C);
    }
  }

  // dgamma and dbeta: each thread owns a block of channels and sums over all rows in order.
  float* dg = dgamma.data_as<float>();
  float* db = dbeta.data_as<float>();
  const int64_t blocks = ceil_div(C, kChannelBlock);
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < blocks; ++block) {
    const int64_t c0 = block * kChannelBlock;
    const int64_t width = std::min(kChannelBlock, C - c0);
    float dy[kChannelBlock], xh[kChannelBlock];
    float g_sum[kChannelBlock] = {}, b_sum[kChannelBlock] = {};
    for (int64_t n = 0; n < N; ++n) {
      load(dout, n * C + c0, width, dy);
      load(x, n * C + c0, width, xh);
      const float m = mean_in[n];
      const float s = rstd_in[n];
      for (int64_t c = 0; c < width; ++c) {
        g_sum[c] += dy[c] * layernorm_xhat(xh[c], m, s);
        b_sum[c] += dy[c];
      }
    }
    for (int64_t c = 0; c < width; ++c) {
      dg[c0 + c] += g_sum[c];
      db[c0 + c] += b_sum[c];
    }
  }
}

}  // namespace mantissa::core
