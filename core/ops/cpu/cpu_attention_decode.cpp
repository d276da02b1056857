// Causal attention of new positions over a KV cache on the CPU (Backend::attention_decode),
// the step of text generation. Operands are read and written as cpu_layer_io.h describes; the
// softmax pieces are core/ops/math/softmax.h's.
//
// For the new row i at position p = start + i and head h, with q its query and k_t, v_t the
// cached keys and values of position t, the math is cpu_attention.cpp's for one query row:
//   s[t] = scale q . k_t  for t <= p  (scale = 1 / sqrt(D)),  P = softmax(s),
//   o    = sum_t P[t] v_t.
// One task per (new row, head). A score sums its channels in eight interleaved partial sums
// (one AVX2 vector), added in a fixed order; the output sums the keys in increasing order.
// Neither depends on the thread count. The cost is O(p D) per row and head: the only part of
// a generation step that grows with the tokens already in the cache.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/int_math.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/cpu/cpu_row_dot.h"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

namespace {

// Lanes of row_dot: the head's channels are padded with zeros to a multiple of them.
constexpr int64_t kLanes = 8;

}  // namespace

void CpuBackend::attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                                  int n_head, int64_t start) {
  const auto [N, S, C, H, D, first] =
      check_attention_decode(qkv, k_cache, v_cache, out, n_head, start, device());

  // The new keys and values join the caches first (rounded to the caches' dtype: exact when it
  // is qkv's), so that a new row sees those of the rows before it.
  std::vector<float> row(static_cast<size_t>(C));
  for (int64_t i = 0; i < N; ++i) {
    load(qkv, i * 3 * C + C, C, row.data());
    store(row.data(), C, k_cache, (first + i) * C);
    load(qkv, i * 3 * C + 2 * C, C, row.data());
    store(row.data(), C, v_cache, (first + i) * C);
  }

  const float scale = attention_scale(D);
  // Below this many multiply-adds (a short context), waking the threads costs more than it
  // saves.
  constexpr int64_t kParallelMin = 1 << 15;
  const bool parallel = N * H * (first + N) * D >= kParallelMin;
#pragma omp parallel if (parallel)
  {
    // q and one cached key at a time, zero-padded to whole vectors.
    const int64_t d_padded = round_up(D, kLanes);
    std::vector<float> q(static_cast<size_t>(d_padded)), cached(static_cast<size_t>(d_padded));
    std::vector<float> o(static_cast<size_t>(D)), p(static_cast<size_t>(first + N));
#pragma omp for schedule(static)
    for (int64_t task = 0; task < N * H; ++task) {
      const int64_t i = task / H, h = task % H;
      const int64_t n = first + i + 1;  // visible positions
      load(qkv, i * 3 * C + h * D, D, q.data());
      // Softmax in FP32, shifted by the maximum so that exp never overflows. A NaN score never
      // wins the comparison but still turns the sum, hence the row, into NaN.
      float max_score = -INFINITY;
      for (int64_t t = 0; t < n; ++t) {
        load(k_cache, t * C + h * D, D, cached.data());
        p[t] = row_dot(q.data(), cached.data(), d_padded) * scale;
        max_score = softmax_max(max_score, p[t]);
      }
      float sum = 0.0f;
      for (int64_t t = 0; t < n; ++t) {
        p[t] = softmax_exp(p[t], max_score);
        sum += p[t];
      }
      const float inv_sum = 1.0f / sum;
      for (int64_t t = 0; t < n; ++t) p[t] *= inv_sum;

      std::fill(o.begin(), o.end(), 0.0f);
      for (int64_t t = 0; t < n; ++t) {
        load(v_cache, t * C + h * D, D, cached.data());
        for (int64_t d = 0; d < D; ++d) o[d] += p[t] * cached[d];
      }
      store(o.data(), D, out, i * C + h * D);
    }
  }
}

}  // namespace mantissa::core
