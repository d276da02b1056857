// SwiGLU on the CPU (the per-element math is core/ops/math/swiglu.h's, shared with the CUDA
// backend, so the two agree bit for bit). One row of gate_up[N, 2I] per iteration; in the
// backward each (gate, up) pair is read before its gradients are written, so dgate_up may be
// gate_up itself. Operands are read and written as cpu_layer_io.h describes.
#include <vector>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/math/swiglu.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

// out[n, j] = silu(gate[n, j]) * up[n, j], gate = gate_up[n, j], up = gate_up[n, I + j].
void CpuBackend::swiglu_forward(const Tensor& gate_up, Tensor& out) {
  const auto [N, I] = check_swiglu_forward(gate_up, out, device());
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(3 * I));
    float* gu = buffer.data();
    float* o = gu + 2 * I;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      load(gate_up, n * 2 * I, 2 * I, gu);
#pragma omp simd
      for (int64_t j = 0; j < I; ++j) o[j] = swiglu_out(gu[j], gu[I + j]);
      store(o, I, out, n * I);
    }
  }
}

// dgate = dout * up * silu'(gate), dup = dout * silu(gate).
void CpuBackend::swiglu_backward(const Tensor& dout, const Tensor& gate_up, Tensor& dgate_up) {
  const auto [N, I] = check_swiglu_backward(dout, gate_up, dgate_up, device());
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(3 * I));
    float* gu = buffer.data();
    float* dy = gu + 2 * I;
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      load(gate_up, n * 2 * I, 2 * I, gu);
      load(dout, n * I, I, dy);
#pragma omp simd
      for (int64_t j = 0; j < I; ++j) {
        const float g = gu[j];
        const float u = gu[I + j];
        gu[j] = dy[j] * u * silu_grad(g);
        gu[I + j] = dy[j] * silu(g);
      }
      store(gu, 2 * I, dgate_up, n * 2 * I);
    }
  }
}

}  // namespace mantissa::core
