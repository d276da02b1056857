// FP32 -> storage-dtype narrowing in AVX-512 (sixteen lanes): stochastic rounding to every
// reduced-precision dtype and round-to-nearest to FP8, which cpu_convert.cpp runs instead of
// its AVX2 code on CPUs that have AVX-512 F, BW, VL and DQ. Results equal the scalar
// definitions in core/dtype/dtype.h bit for bit, like the AVX2 code's.
#pragma once

#include <cstdint>

#include "core/dtype/dtype.h"

namespace mantissa::core::avx512 {

// True when this CPU has AVX-512 F, BW, VL and DQ and the environment does not turn these
// kernels off with MANTISSA_CPU_AVX512_CONVERT=0 (which keeps the AVX2 code, for comparison).
// The same switch governs the other AVX-512 code that has an AVX2 twin: block quantisation,
// GELU and the attention op's products.
bool narrow_enabled();

// dst[i] = Rounder<T>::nearest(to_float(src[i]) * scale, saturation) for i in [0, n); returns
// the maximum bit pattern of |to_float(src[i])| (above 0x7F800000 when some src[i] is NaN).
// Requires narrow_enabled(). Only FP8: rounding to BF16 or F16 takes one or two AVX2
// instructions per eight values and runs at memory speed in AVX2 already (bench_cpu_convert).
uint32_t narrow_nearest(const float* src, fp8_e4m3* dst, int64_t n, float scale, Saturation);
uint32_t narrow_nearest(const float* src, fp8_e5m2* dst, int64_t n, float scale, Saturation);
uint32_t narrow_nearest(const bf16* src, fp8_e4m3* dst, int64_t n, float scale, Saturation);
uint32_t narrow_nearest(const bf16* src, fp8_e5m2* dst, int64_t n, float scale, Saturation);
uint32_t narrow_nearest(const fp16* src, fp8_e4m3* dst, int64_t n, float scale, Saturation);
uint32_t narrow_nearest(const fp16* src, fp8_e5m2* dst, int64_t n, float scale, Saturation);

// dst[i] = Rounder<T>::stochastic(src[i] * scale, random_u32(key, first_offset + i),
// saturation) for i in [0, n), the offsets not wrapping past 2^32; returns the amax pattern
// as narrow_nearest does. Requires narrow_enabled().
struct StochasticRun {
  RandomKey key;
  uint32_t first_offset;
};
uint32_t narrow_stochastic(const float* src, bf16* dst, int64_t n, float scale, Saturation,
                           StochasticRun);
uint32_t narrow_stochastic(const float* src, fp16* dst, int64_t n, float scale, Saturation,
                           StochasticRun);
uint32_t narrow_stochastic(const float* src, fp8_e4m3* dst, int64_t n, float scale, Saturation,
                           StochasticRun);
uint32_t narrow_stochastic(const float* src, fp8_e5m2* dst, int64_t n, float scale, Saturation,
                           StochasticRun);

}  // namespace mantissa::core::avx512
