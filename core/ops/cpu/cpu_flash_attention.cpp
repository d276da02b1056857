// Flash attention on the CPU (Backend::flash_attention_forward and _backward): the reference
// the CUDA kernels are tested against, and the same function for a CPU run that asks for it.
// One (batch, head) pair per task, row by row in FP32 scratch, with the softmax pieces of
// core/ops/math/softmax.h. Like the GPU kernels it keeps no T x T matrix between forward and
// backward, only lse; within a task one row of T scores at a time.
//
// Forward, row t (scale = 1 / sqrt(D)):
//   z = scale q_t K^T over t2 <= t,  m = max z,  l = sum exp(z - m),  lse_t = m + log l,
//   out_t = sum_t2 round(exp(z - m) / l) v_t2
// Backward, from delta_t = dout_t . out_t and P recomputed as exp(z - lse_t):
//   dP = dout_t V^T,  dS = round(scale P (dP - delta_t)),
//   dQ_t = dS K,  dK_t2 += dS q_t,  dV_t2 += round(P) dout_t,
// where round() is the rounding to qkv's dtype that the GPU's tensor-core operands take.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

namespace {

// x as a product operand of `dtype` sees it: rounded to nearest even, widened back.
float as_operand(float x, DType dtype) {
  if (dtype == DType::kBF16) return to_float(round_to<bf16>(x));
  if (dtype == DType::kF16) return to_float(round_to<fp16>(x));
  return x;
}

float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

// One head's rows of Q, K and V from qkv[B, T, 3C], widened to FP32 [T, D] each.
struct HeadRows {
  std::vector<float> q, k, v;

  HeadRows(const Tensor& qkv, int64_t b, int64_t h, const AttentionDims& d)
      : q(static_cast<size_t>(d.T * d.D)), k(q.size()), v(q.size()) {
    for (int64_t t = 0; t < d.T; ++t) {
      const int64_t row = (b * d.T + t) * 3 * d.C + h * d.D;
      load(qkv, row, d.D, q.data() + t * d.D);
      load(qkv, row + d.C, d.D, k.data() + t * d.D);
      load(qkv, row + 2 * d.C, d.D, v.data() + t * d.D);
    }
  }
};

}  // namespace

void CpuBackend::flash_attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, int n_head) {
  const AttentionDims d = check_flash_attention_forward(qkv, out, lse, n_head, device());
  const auto [B, T, C, H, D] = d;
  const float scale = attention_scale(D);
  float* lse_data = lse.data_as<float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const HeadRows head(qkv, b, h, d);
      std::vector<float> z(static_cast<size_t>(T)), o(static_cast<size_t>(D));
      for (int64_t t = 0; t < T; ++t) {
        float m = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          z[t2] = scale * dot(&head.q[t * D], &head.k[t2 * D], D);
          m = softmax_max(m, z[t2]);
        }
        float l = 0.0f;
        for (int64_t t2 = 0; t2 <= t; ++t2) l += softmax_exp(z[t2], m);
        lse_data[(b * H + h) * T + t] = softmax_log_sum_exp(m, l);
        std::fill(o.begin(), o.end(), 0.0f);
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float p = as_operand(softmax_exp(z[t2], m) / l, qkv.dtype());
          for (int64_t c = 0; c < D; ++c) o[c] += p * head.v[t2 * D + c];
        }
        store(o.data(), D, out, (b * T + t) * C + h * D);
      }
    }
  }
}

void CpuBackend::flash_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                          const Tensor& lse, Tensor& dqkv, int n_head) {
  const AttentionDims d =
      check_flash_attention_backward(dout, qkv, out, lse, dqkv, n_head, device());
  const auto [B, T, C, H, D] = d;
  const float scale = attention_scale(D);
  const float* lse_data = lse.data_as<const float>();
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const HeadRows head(qkv, b, h, d);
      std::vector<float> dy(static_cast<size_t>(D)), y(dy.size()), dq(dy.size());
      std::vector<float> dk(static_cast<size_t>(T * D), 0.0f), dv(dk.size(), 0.0f);
      for (int64_t t = 0; t < T; ++t) {
        load(dout, (b * T + t) * C + h * D, D, dy.data());
        load(out, (b * T + t) * C + h * D, D, y.data());
        const float delta = dot(dy.data(), y.data(), D);
        const float row_lse = lse_data[(b * H + h) * T + t];
        std::fill(dq.begin(), dq.end(), 0.0f);
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float p = softmax_exp(scale * dot(&head.q[t * D], &head.k[t2 * D], D), row_lse);
          const float dp = dot(dy.data(), &head.v[t2 * D], D);
          const float ds = as_operand(scale * softmax_backward(p, dp, delta), qkv.dtype());
          const float p_operand = as_operand(p, qkv.dtype());
          for (int64_t c = 0; c < D; ++c) {
            dq[c] += ds * head.k[t2 * D + c];
            dk[t2 * D + c] += ds * head.q[t * D + c];
            dv[t2 * D + c] += p_operand * dy[c];
          }
        }
        store(dq.data(), D, dqkv, (b * T + t) * 3 * C + h * D);
      }
      for (int64_t t2 = 0; t2 < T; ++t2) {
        const int64_t row = (b * T + t2) * 3 * C + h * D;
        store(&dk[t2 * D], D, dqkv, row + C);
        store(&dv[t2 * D], D, dqkv, row + 2 * C);
      }
    }
  }
}

std::string CpuBackend::unsupported_flash_attention(DType, int64_t) const {
  return "";
}

}  // namespace mantissa::core
