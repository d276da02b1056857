// Grouped-query attention's key/value heads on the CPU (the CUDA backend's twin is
// cuda_kv_heads.cu). One (b, t) row per iteration: the forward copies each head of the row
// to where the multi-head layout wants it, the backward sums each key/value head's group of
// gradients in head order. Operands are read and written as cpu_layer_io.h describes.
#include <vector>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

// Row layouts: grouped q[H] | k[KV] | v[KV] heads, expanded q[H] | k[H] | v[H] heads, D
// channels each; expanded key head h is grouped key head h / G (G = H / KV), values likewise.
void CpuBackend::repeat_kv_heads(const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                 Tensor& out) {
  const auto [B, T, H, KV, D] = check_repeat_kv_heads(qkv, n_head, n_kv_head, out, device());
  const int64_t group = H / KV, in_row = (H + 2 * KV) * D, out_row = 3 * H * D;
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(in_row + out_row));
    float* in = buffer.data();
    float* o = in + in_row;
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      load(qkv, bt * in_row, in_row, in);
      for (int64_t i = 0; i < H * D; ++i) o[i] = in[i];
      for (int64_t part = 1; part <= 2; ++part) {  // keys, then values
        const float* src = in + H * D + (part - 1) * KV * D;
        float* dst = o + part * H * D;
        for (int64_t h = 0; h < H; ++h) {
          for (int64_t d = 0; d < D; ++d) dst[h * D + d] = src[(h / group) * D + d];
        }
      }
      store(o, out_row, out, bt * out_row);
    }
  }
}

void CpuBackend::repeat_kv_heads_backward(const Tensor& dout, int64_t n_head, int64_t n_kv_head,
                                          Tensor& dqkv) {
  const auto [B, T, H, KV, D] =
      check_repeat_kv_heads_backward(dout, n_head, n_kv_head, dqkv, device());
  const int64_t group = H / KV, in_row = 3 * H * D, out_row = (H + 2 * KV) * D;
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(in_row + out_row));
    float* dy = buffer.data();
    float* dx = dy + in_row;
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < B * T; ++bt) {
      load(dout, bt * in_row, in_row, dy);
      for (int64_t i = 0; i < H * D; ++i) dx[i] = dy[i];
      for (int64_t part = 1; part <= 2; ++part) {
        const float* src = dy + part * H * D;
        float* dst = dx + H * D + (part - 1) * KV * D;
        for (int64_t j = 0; j < KV; ++j) {
          for (int64_t d = 0; d < D; ++d) {
            float sum = 0.0f;
            for (int64_t g = 0; g < group; ++g) sum += src[(j * group + g) * D + d];
            dst[j * D + d] = sum;
          }
        }
      }
      store(dx, out_row, dqkv, bt * out_row);
    }
  }
}

}  // namespace mantissa::core
