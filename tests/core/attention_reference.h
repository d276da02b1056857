// FP64 references of causal multi-head self-attention, written independently of the backends
// (the straightforward loops over heads, rows and keys), shared by the CPU tests of the
// attention op (test_cpu_layers.cpp), of the composed routine and its primitives
// (test_attention.cpp) and of flash attention (test_flash_attention.cpp).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>

#include "tests/core/fp64_reference.h"

namespace mantissa::core {

struct AttnShape {
  int64_t B, T, C, H;
  int64_t D() const { return C / H; }
  Shape qkv() const { return Shape{B, T, 3 * C}; }
  Shape out() const { return Shape{B, T, C}; }
  Shape att() const { return Shape{B, H, T, T}; }
  // which: 0 query, 1 key, 2 value.
  int64_t qkv_index(int64_t b, int64_t t, int which, int64_t h, int64_t d) const {
    return ((b * T + t) * 3 + which) * C + h * D() + d;
  }
};

// Odd T and D, several heads and batches, one head of one channel, a single position.
inline const AttnShape kAttentionShapes[] = {
    {2, 37, 48, 3}, {3, 9, 15, 3}, {1, 48, 80, 2}, {2, 5, 3, 3}, {1, 1, 6, 1}};

inline std::string describe(const AttnShape& s, DType dtype) {
  return std::string(dtype_name(dtype)) + " B " + std::to_string(s.B) + " T " +
         std::to_string(s.T) + " C " + std::to_string(s.C) + " H " + std::to_string(s.H);
}

// n values drawn uniformly from [lo, hi).
inline Vec uniform(std::mt19937_64& rng, int64_t n, double lo = -1.0, double hi = 1.0) {
  std::uniform_real_distribution<double> dist(lo, hi);
  Vec v(static_cast<size_t>(n));
  for (double& x : v) x = dist(rng);
  return v;
}

struct AttentionRef {
  Vec out, att;
};

inline AttentionRef attention_ref(const Vec& qkv, const AttnShape& s) {
  const int64_t D = s.D();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  AttentionRef r{Vec(s.out().numel(), 0.0), Vec(s.att().numel(), 0.0)};
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t t = 0; t < s.T; ++t) {
        Vec score(t + 1);
        double max_score = -INFINITY;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          double q_k = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            q_k += qkv[s.qkv_index(b, t, 0, h, d)] * qkv[s.qkv_index(b, t2, 1, h, d)];
          }
          score[t2] = q_k * scale;
          max_score = std::max(max_score, score[t2]);
        }
        double sum = 0.0;
        for (double& x : score) sum += (x = std::exp(x - max_score));
        double* p = r.att.data() + ((b * s.H + h) * s.T + t) * s.T;
        for (int64_t t2 = 0; t2 <= t; ++t2) p[t2] = score[t2] / sum;
        for (int64_t d = 0; d < D; ++d) {
          double o = 0.0;
          for (int64_t t2 = 0; t2 <= t; ++t2) o += p[t2] * qkv[s.qkv_index(b, t2, 2, h, d)];
          r.out[(b * s.T + t) * s.C + h * D + d] = o;
        }
      }
    }
  }
  return r;
}

// lse[b, h, t] = log sum_{t2 <= t} exp(scale q_t . k_t2): what flash attention keeps per row.
inline Vec attention_lse_ref(const Vec& qkv, const AttnShape& s) {
  const int64_t D = s.D();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Vec lse(static_cast<size_t>(s.B * s.H * s.T));
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t t = 0; t < s.T; ++t) {
        double sum = 0.0;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          double q_k = 0.0;
          for (int64_t d = 0; d < D; ++d) {
            q_k += qkv[s.qkv_index(b, t, 0, h, d)] * qkv[s.qkv_index(b, t2, 1, h, d)];
          }
          sum += std::exp(q_k * scale);
        }
        lse[(b * s.H + h) * s.T + t] = std::log(sum);
      }
    }
  }
  return lse;
}

// dqkv by the chain rule through the full softmax Jacobian dP_j/dS_k = P_j (delta_jk - P_k).
inline Vec attention_backward_ref(const Vec& dout, const Vec& qkv, const AttnShape& s) {
  const int64_t D = s.D();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  const Vec att = attention_ref(qkv, s).att;
  Vec dqkv(qkv.size(), 0.0);
  for (int64_t b = 0; b < s.B; ++b) {
    for (int64_t h = 0; h < s.H; ++h) {
      for (int64_t t = 0; t < s.T; ++t) {
        const double* p = att.data() + ((b * s.H + h) * s.T + t) * s.T;
        const double* dy = dout.data() + (b * s.T + t) * s.C + h * D;
        Vec dp(t + 1, 0.0);
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          for (int64_t d = 0; d < D; ++d) {
            dp[t2] += dy[d] * qkv[s.qkv_index(b, t2, 2, h, d)];
            dqkv[s.qkv_index(b, t2, 2, h, d)] += p[t2] * dy[d];
          }
        }
        for (int64_t k = 0; k <= t; ++k) {
          double dscore = 0.0;
          for (int64_t j = 0; j <= t; ++j) dscore += dp[j] * p[j] * ((j == k ? 1.0 : 0.0) - p[k]);
          for (int64_t d = 0; d < D; ++d) {
            dqkv[s.qkv_index(b, t, 0, h, d)] += dscore * scale * qkv[s.qkv_index(b, k, 1, h, d)];
            dqkv[s.qkv_index(b, k, 1, h, d)] += dscore * scale * qkv[s.qkv_index(b, t, 0, h, d)];
          }
        }
      }
    }
  }
  return dqkv;
}

}  // namespace mantissa::core
