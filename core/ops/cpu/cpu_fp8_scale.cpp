// FP8 scales derived from amaxes on the CPU (the CUDA backend's twin is cuda_fp8_scale.cu):
// core/precision/fp8_scale.h's rules on scalars.
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/op_checks.h"
#include "core/precision/fp8_scale.h"

namespace mantissa::core {

void CpuBackend::fp8_scale_from_amax(const Tensor& amax, float fp8_max, int margin, Tensor& scale,
                                     Tensor& scale_inv) {
  check_fp8_scale_from_amax(amax, fp8_max, margin, scale, scale_inv, device());
  float& s = scale.data_as<float>()[0];
  s = fp8_scale_for(amax.data_as<const float>()[0], s, fp8_max, margin);
  scale_inv.data_as<float>()[0] = fp8_scale_inverse(s);
}

void CpuBackend::fp8_reduce_scales(const Tensor& amax, float fp8_max, int world_size, Tensor& q,
                                   Tensor& w) {
  check_fp8_reduce_scales(amax, fp8_max, world_size, q, w, device());
  const Fp8ReduceScales s =
      fp8_reduce_scales_for(amax.data_as<const float>()[0], fp8_max, world_size);
  q.data_as<float>()[0] = s.q;
  w.data_as<float>()[0] = s.w;
}

}  // namespace mantissa::core
