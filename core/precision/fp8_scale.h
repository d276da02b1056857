// The per-tensor FP8 scale rule of fp8_scaling.h, written once for the host (the registry's
// DELAYED and CURRENT updates) and the device (Backend::fp8_scale_from_amax, which keeps a
// CURRENT step on the device: no host round trip per operand):
//   scale     = (fp8_max / max(amax, 1e-12)) / 2^margin, in double, rounded once to float;
//               the old scale when amax is 0 or not finite;
//   scale_inv = 1 / scale, in double, rounded once.
#pragma once

#include "core/dtype/dtype.h"

namespace mantissa::core {

MANTISSA_HD float fp8_scale_for(float amax, float old_scale, float fp8_max, int margin) {
  const bool finite = (float_to_bits(amax) & 0x7F800000u) != 0x7F800000u;
  if (amax == 0.0f || !finite) return old_scale;
  const double floored = static_cast<double>(amax) > 1e-12 ? static_cast<double>(amax) : 1e-12;
  double headroom = 1.0;  // 2^margin, exactly (margin <= 100)
  for (int i = 0; i < margin; ++i) headroom *= 2.0;
  return static_cast<float>(static_cast<double>(fp8_max) / floored / headroom);
}

MANTISSA_HD float fp8_scale_inverse(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

}  // namespace mantissa::core
