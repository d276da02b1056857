// Constants the vectorised narrowing kernels (cpu_convert.cpp in AVX2, cpu_narrow_avx512.cpp
// in AVX-512) derive from core/dtype/dtype.h's description of the small float formats.
#pragma once

#include <cstdint>

#include "core/dtype/dtype.h"

namespace mantissa::core {

// The FP32 pattern of the value a normal code of format f stands for. The codes for inf and
// NaN are read as if their exponent were an ordinary one (E5M2 0x7C as 2^16, E4M3 0x7F as
// 480), so that rounding that value gives the code back.
constexpr uint32_t code_bits(SmallFloatFormat f, uint32_t code) {
  const uint32_t exponent = code >> f.man_bits;
  const uint32_t mantissa = code & ((1u << f.man_bits) - 1);
  return (exponent - f.bias + 127) << 23 | mantissa << (23 - f.man_bits);
}

// The format of each FP8 storage type (undefined for the others, which leaves overloads
// that name Fp8Format<T>::value out of their overload sets for those).
template <class T>
struct Fp8Format;
template <>
struct Fp8Format<fp8_e4m3> {
  static constexpr SmallFloatFormat value = e4m3_format();
};
template <>
struct Fp8Format<fp8_e5m2> {
  static constexpr SmallFloatFormat value = e5m2_format();
};

}  // namespace mantissa::core
