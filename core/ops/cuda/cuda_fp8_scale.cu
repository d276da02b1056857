// FP8 scales derived from amaxes on the GPU (the CPU backend's twin is cpu_fp8_scale.cpp; both
// run core/precision/fp8_scale.h): one thread on the backend's stream, after what wrote the
// amax and before the cast that reads the scales, with no host round trip.
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/op_checks.h"
#include "core/precision/fp8_scale.h"

namespace mantissa::core {
namespace {

__global__ void fp8_scale_kernel(const float* amax, float fp8_max, int margin, float* scale,
                                 float* scale_inv) {
  const float s = fp8_scale_for(*amax, *scale, fp8_max, margin);
  *scale = s;
  *scale_inv = fp8_scale_inverse(s);
}

__global__ void fp8_reduce_scales_kernel(const float* amax, float fp8_max, int world_size, float* q,
                                         float* w) {
  const Fp8ReduceScales s = fp8_reduce_scales_for(*amax, fp8_max, world_size);
  *q = s.q;
  *w = s.w;
}

}  // namespace

void CudaBackend::fp8_scale_from_amax(const Tensor& amax, float fp8_max, int margin, Tensor& scale,
                                      Tensor& scale_inv) {
  check_fp8_scale_from_amax(amax, fp8_max, margin, scale, scale_inv, device());
  fp8_scale_kernel<<<1, 1, 0, stream()>>>(amax.data_as<const float>(), fp8_max, margin,
                                          scale.data_as<float>(), scale_inv.data_as<float>());
  MANTISSA_CUDA_CHECK_LAUNCH();
}

void CudaBackend::fp8_reduce_scales(const Tensor& amax, float fp8_max, int world_size, Tensor& q,
                                    Tensor& w) {
  check_fp8_reduce_scales(amax, fp8_max, world_size, q, w, device());
  fp8_reduce_scales_kernel<<<1, 1, 0, stream()>>>(amax.data_as<const float>(), fp8_max, world_size,
                                                  q.data_as<float>(), w.data_as<float>());
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
