// Rotary position embeddings on the CPU (the rotation is core/ops/math/rope.h's, shared with
// the CUDA backend). One (batch, position) row of H heads per iteration, of which the first R
// are rotated and the rest copied; the row is read before it is written, so out may be x
// itself. Operands are read and written as cpu_layer_io.h describes.
#include <vector>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/math/rope.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cpu_layer_io;

// out = in with its first d.R heads rotated by +angle (sign 1) or -angle (sign -1).
void rope_rotate_rows(const Tensor& in, const Tensor& table, const RopeDims& d, float sign,
                      Tensor& out) {
  const int64_t half = d.D / 2;
  const int64_t row = d.H * d.D;
  const float* angles = table.data_as<const float>();
#pragma omp parallel
  {
    std::vector<float> buffer(static_cast<size_t>(row + half));
    float* r = buffer.data();
    float* sin_a = r + row;
#pragma omp for schedule(static)
    for (int64_t bt = 0; bt < d.B * d.T; ++bt) {
      const float* cs = angles + (d.start + bt % d.T) * d.D;
      for (int64_t i = 0; i < half; ++i) sin_a[i] = sign * cs[half + i];
      load(in, bt * row, row, r);
      for (int64_t h = 0; h < d.R; ++h) {
        float* lo = r + h * d.D;
        float* hi = lo + half;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const RopePair p = rope_rotate(lo[i], hi[i], cs[i], sin_a[i]);
          lo[i] = p.lo;
          hi[i] = p.hi;
        }
      }
      store(r, row, out, bt * row);
    }
  }
}

}  // namespace

void CpuBackend::rope_forward(const Tensor& x, const Tensor& table, int64_t start, int64_t rotated,
                              Tensor& out) {
  const RopeDims d =
      check_rope("rope_forward", x, "x", table, start, rotated, out, "out", device());
  rope_rotate_rows(x, table, d, 1.0f, out);
}

void CpuBackend::rope_backward(const Tensor& dout, const Tensor& table, int64_t start,
                               int64_t rotated, Tensor& dx) {
  const RopeDims d =
      check_rope("rope_backward", dout, "dout", table, start, rotated, dx, "dx", device());
  rope_rotate_rows(dout, table, d, -1.0f, dx);
}

}  // namespace mantissa::core
