// GEMM operands of random values for the GPU benchmarks: constant inputs would make the tensor
// cores look faster than they are, since their power draw depends on how many bits toggle (an
// 8192^3 BF16 product measured 788 TFLOP/s on random values and 894 on zeros on an H200).
#pragma once

#include <cstdint>

#include "core/dtype/dtype.h"
#include "core/ops/backend.h"

namespace mantissa::bench {

// Values uniform in [-1, 1) (FP8 codes in [-200, 200), for a scale of 1/200), rounded into
// `dtype` (F32, BF16 or E4M3) on the host and copied to the backend's device. The same seed
// gives the same tensor.
inline core::Tensor random_operand(core::Backend& backend, const core::Shape& shape,
                                   core::DType dtype, uint64_t seed) {
  core::Tensor host = core::Tensor::empty(shape, dtype);
  uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  const float range = core::is_fp8(dtype) ? 200.0f : 1.0f;
  for (int64_t i = 0; i < host.numel(); ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    const float u = static_cast<float>(state >> 40) * (2.0f / 16777216.0f) - 1.0f;
    const float v = u * range;
    switch (dtype) {
      case core::DType::kBF16: host.data_as<core::bf16>()[i] = core::round_to<core::bf16>(v); break;
      case core::DType::kE4M3:
        host.data_as<core::fp8_e4m3>()[i] = core::round_to<core::fp8_e4m3>(v);
        break;
      default: host.data_as<float>()[i] = v; break;
    }
  }
  core::Tensor device = core::Tensor::empty(shape, dtype, backend.device());
  backend.copy(host, device);
  return device;
}

}  // namespace mantissa::bench
