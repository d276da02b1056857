// Integer rounding for sizes, block counts and padding, for host and device alike.
#pragma once

#include <cstdint>

#include "core/host_device.h"

namespace mantissa::core {

// ceil(a / b) and a rounded up to a multiple of b, for a >= 0 and b > 0.
MANTISSA_HD constexpr int64_t ceil_div(int64_t a, int64_t b) {
  return (a + b - 1) / b;
}
MANTISSA_HD constexpr int64_t round_up(int64_t a, int64_t b) {
  return ceil_div(a, b) * b;
}

}  // namespace mantissa::core
