// Rotary position embeddings on the GPU: the rotation is core/ops/math/rope.h's, the CPU
// backend's (cpu_rope.cpp), so the two agree bit for bit. One thread per pair of channels
// (i, i + D/2) of one head, in a grid-stride loop: the first R heads of each row are rotated,
// the rest copied. The thread reads both channels before it writes both, so out may be the
// input itself. Operands are read and written as cuda_layer_io.cuh
// describes.
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/math/rope.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;

// in, out [B, T, H, D]; table [S, D] (cos | sin); heads [0, R) of each row rotate, by +angle
// (sign 1) or -angle (sign -1).
__global__ void rope_kernel(FloatIn in, const float* __restrict__ table, FloatOut out, int64_t T,
                            int64_t H, int64_t D, int64_t R, int64_t start, float sign,
                            int64_t pairs) {
  const int64_t half = D / 2;
  for (int64_t k = global_thread_index(); k < pairs; k += grid_stride()) {
    const int64_t i = k % half;
    const int64_t head = k / half;  // (b, t, h) flattened
    const int64_t lo = head * D + i;
    RopePair p{load(in, lo), load(in, lo + half)};
    if (head % H < R) {
      const float* cs = table + (start + head / H % T) * D;
      p = rope_rotate(p.lo, p.hi, cs[i], sign * cs[half + i]);
    }
    store(out, lo, p.lo);
    store(out, lo + half, p.hi);
  }
}

void launch_rope(const Tensor& in, const Tensor& table, const RopeDims& d, float sign, Tensor& out,
                 int multiprocessor_count, cudaStream_t stream) {
  const int64_t pairs = d.B * d.T * d.H * (d.D / 2);
  if (pairs == 0) return;
  rope_kernel<<<grid_size(pairs, kBlock, multiprocessor_count), kBlock, 0, stream>>>(
      as_in(in), table.data_as<const float>(), as_out(out), d.T, d.H, d.D, d.R, d.start, sign,
      pairs);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace

void CudaBackend::rope_forward(const Tensor& x, const Tensor& table, int64_t start, int64_t rotated,
                               Tensor& out) {
  const RopeDims d =
      check_rope("rope_forward", x, "x", table, start, rotated, out, "out", device());
  launch_rope(x, table, d, 1.0f, out, multiprocessor_count_, stream());
}

void CudaBackend::rope_backward(const Tensor& dout, const Tensor& table, int64_t start,
                                int64_t rotated, Tensor& dx) {
  const RopeDims d =
      check_rope("rope_backward", dout, "dout", table, start, rotated, dx, "dx", device());
  launch_rope(dout, table, d, -1.0f, dx, multiprocessor_count_, stream());
}

}  // namespace mantissa::core
