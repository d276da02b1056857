// The per-tensor FP8 scale of an amax on the CPU (the CUDA backend's twin is
// cuda_fp8_scale.cu): core/precision/fp8_scale.h's rule on three scalars.
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

}  // namespace mantissa::core
