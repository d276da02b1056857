// Shared by the dist tests: every test program runs under mpirun, one process per rank, and
// its main (dist_test_main.cpp) owns the World. Each rank runs every test; a failure on any
// rank fails the program on every rank.
#pragma once

#include <cmath>

#include "core/tensor/tensor.h"
#include "dist/world.h"

namespace mantissa::dist::testing {

World& world();

// Unit roundoff and half the smallest subnormal of each floating dtype (0 for the others),
// for the error bounds of reduced-precision sums.
inline double unit_roundoff(core::DType d) {
  switch (d) {
    case core::DType::kF32: return std::ldexp(1.0, -24);
    case core::DType::kBF16: return std::ldexp(1.0, -8);
    case core::DType::kF16: return std::ldexp(1.0, -11);
    case core::DType::kE4M3: return std::ldexp(1.0, -4);
    case core::DType::kE5M2: return std::ldexp(1.0, -3);
    default: return 0.0;
  }
}
inline double half_min_subnormal(core::DType d) {
  switch (d) {
    case core::DType::kF32: return std::ldexp(1.0, -150);
    case core::DType::kBF16: return std::ldexp(1.0, -134);
    case core::DType::kF16: return std::ldexp(1.0, -25);
    case core::DType::kE4M3: return std::ldexp(1.0, -10);
    case core::DType::kE5M2: return std::ldexp(1.0, -17);
    default: return 0.0;
  }
}

}  // namespace mantissa::dist::testing
