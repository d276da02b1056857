// The attention primitives on the CPU (core/ops/attention.h composes them with batched GEMMs;
// the CUDA twins are in cuda_attention.cu): the head permutations and the causal softmax with
// its backward, one row per iteration, the rows split over the OpenMP threads. Operands are
// read and written as cpu_layer_io.h describes; the softmax math is core/ops/math/softmax.h's,
// in the order of the fused kernel in cpu_attention.cpp.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/cpu/cpu_softmax_rows.h"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

namespace {

// n elements from src at src_offset to dst at dst_offset: a plain copy when the dtypes agree,
// else widened to FP32 through `row` and rounded once.
void copy_run(const Tensor& src, int64_t src_offset, const Tensor& dst, int64_t dst_offset,
              int64_t n, float* row) {
  if (src.dtype() == dst.dtype()) {
    const size_t size = dtype_size(src.dtype());
    std::memcpy(static_cast<char*>(dst.data()) + dst_offset * size,
                static_cast<const char*>(src.data()) + src_offset * size, n * size);
  } else {
    load(src, src_offset, n, row);
    store(row, n, dst, dst_offset);
  }
}

// Moves every head of rows[B, T, P*H*D] to or from heads[P, B, H, T, D]: one (b, t) row per
// iteration, its P*H runs of D channels.
void permute_heads(const Tensor& src, const Tensor& dst, const HeadsDims& d, bool to_heads) {
  const auto [P, B, H, T, D] = d;
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(D));
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      const int64_t b = bt / T, t = bt % T;
      for (int64_t p = 0; p < P; ++p) {
        for (int64_t h = 0; h < H; ++h) {
          const int64_t row_offset = (bt * P + p) * H * D + h * D;
          const int64_t head_offset = (((p * B + b) * H + h) * T + t) * D;
          if (to_heads) {
            copy_run(src, row_offset, dst, head_offset, D, row.data());
          } else {
            copy_run(src, head_offset, dst, row_offset, D, row.data());
          }
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::split_heads(const Tensor& x, Tensor& out) {
  permute_heads(x, out, check_split_heads(x, out, device()), true);
}

void CpuBackend::merge_heads(const Tensor& x, Tensor& out) {
  permute_heads(x, out, check_merge_heads(x, out, device()), false);
}

// Row r = (n, t) of the N score matrices sees its first t + 1 columns.
void CpuBackend::causal_softmax_forward(const Tensor& scores, float scale, Tensor& probs) {
  const auto [N, T] = check_causal_softmax_forward(scores, scale, probs, device());
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(T));
    float* p = row.data();
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N * T; ++r) {
      const int64_t n = r % T + 1;  // visible columns
      load(scores, r * T, n, p);
      // Shifted by the maximum so that exp never overflows. A NaN never wins the comparison
      // but still turns the sum, hence the row, into NaN.
      for (int64_t j = 0; j < n; ++j) p[j] *= scale;
      const float max_z = softmax_row_max(p, n);
      softmax_exp_row(p, n, max_z);
      const float sum = softmax_row_sum(p, n);
      const float inv_sum = 1.0f / sum;
      for (int64_t j = 0; j < n; ++j) p[j] *= inv_sum;
      std::fill(p + n, p + T, 0.0f);
      store(p, T, probs, r * T);
    }
  }
}

void CpuBackend::causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale,
                                         Tensor& dscores) {
  const auto [N, T] = check_causal_softmax_backward(probs, dprobs, scale, dscores, device());
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(2 * T));
    float* p = buffer.data();
    float* g = p + T;  // dP, then dS
#pragma omp for schedule(static)
    for (int64_t r = 0; r < N * T; ++r) {
      const int64_t n = r % T + 1;
      load(probs, r * T, n, p);
      load(dprobs, r * T, n, g);
      float p_dp = 0.0f;
      for (int64_t j = 0; j < n; ++j) p_dp += p[j] * g[j];
      for (int64_t j = 0; j < n; ++j) g[j] = softmax_backward(p[j], g[j], p_dp) * scale;
      std::fill(g + n, g + T, 0.0f);
      store(g, T, dscores, r * T);
    }
  }
}

}  // namespace mantissa::core
