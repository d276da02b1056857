// FP8 scale rules written once for the host and the device, so that the scales a step uses can
// be derived where its amaxes are, without a host round trip:
//
// The per-tensor operand scale of fp8_scaling.h (the registry's DELAYED and CURRENT updates on
// the host; Backend::fp8_scale_from_amax for CURRENT on the device):
//   scale     = (fp8_max / max(amax, 1e-12)) / 2^margin, in double, rounded once to float;
//               the old scale when amax is 0 or not finite;
//   scale_inv = 1 / scale, in double, rounded once.
//
// The shared pre-scale of FP8 gradient reduction over N ranks (dist/bucketed_grad_sync.cpp
// derives it; Backend::fp8_reduce_scales applies it on the device):
//   q = min(fp8_max / (N amax), 2^(126 - ceil(log2 N))), or 1/N when amax is 0 or not finite;
//   w = 1 / (N q);
// both in double, each rounded once (w from the rounded q).
//
// Amaxes combined (a step's micro-batches: Backend::cast's and quantize_blocks'
// accumulate_amax): the larger, a NaN larger than any number, as ordering the bits of
// non-negative floats orders them (the device's atomicMax on those bits does the same).
#pragma once

#include "core/dtype/dtype.h"

namespace mantissa::core {

MANTISSA_HD float fp8_scale_for(float amax, float old_scale, float fp8_max, int margin) {
  const bool finite = !is_nonfinite_bits(amax);
  if (amax == 0.0f || !finite) return old_scale;
  const double floored = static_cast<double>(amax) > 1e-12 ? static_cast<double>(amax) : 1e-12;
  double headroom = 1.0;  // 2^margin, exactly (margin <= 100)
  for (int i = 0; i < margin; ++i) headroom *= 2.0;
  return static_cast<float>(static_cast<double>(fp8_max) / floored / headroom);
}

MANTISSA_HD float larger_amax(float a, float b) {
  const uint32_t x = float_to_bits(a), y = float_to_bits(b);
  return bits_to_float(x > y ? x : y);
}

MANTISSA_HD float fp8_scale_inverse(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

struct Fp8ReduceScales {
  float q;  // gradients are cast as round(g q)
  float w;  // the sum of the codes times w is the average
};

MANTISSA_HD Fp8ReduceScales fp8_reduce_scales_for(float amax, float fp8_max, int world_size) {
  const double n = static_cast<double>(world_size);
  double q = 1.0 / n;
  const bool finite = !is_nonfinite_bits(amax);
  if (finite && amax > 0.0f) {
    int log2_n = 0;  // ceil(log2 N)
    while ((int64_t{1} << log2_n) < world_size) ++log2_n;
    double cap = 1.0;  // 2^(126 - ceil(log2 N)), exactly
    for (int i = 0; i < 126 - log2_n; ++i) cap *= 2.0;
    const double fill = static_cast<double>(fp8_max) / (n * static_cast<double>(amax));
    q = fill < cap ? fill : cap;
  }
  const float q32 = static_cast<float>(q);
  return {q32, static_cast<float>(1.0 / (n * static_cast<double>(q32)))};
}

}  // namespace mantissa::core
