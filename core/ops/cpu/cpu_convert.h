// Bulk conversions between FP32 and the storage dtypes on the CPU: the inner loops of casts,
// GEMM operand widening and compute-copy updates. They use the scalar definitions of
// core/dtype/dtype.h (so results equal the GPU's bit for bit), vectorised or table-driven,
// and split large arrays across OpenMP threads.
#pragma once

#include <cstdint>

#include "core/dtype/dtype.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

// dst[i] = float(src[i]) * scale for any floating dtype (F32, BF16, F16, E4M3, E5M2).
void widen_to_f32(const void* src, DType src_dtype, float* dst, int64_t n, float scale = 1.0f);

struct NarrowOptions {
  float scale = 1.0f;  // dst = round(src * scale)
  Saturation saturation = Saturation::kSatFinite;
  bool stochastic = false;
  uint64_t seed = 0;        // stochastic rounding uses random_u32(seed, index_base + i)
  uint64_t index_base = 0;  // so that a chunked conversion equals a whole one
  bool want_amax = false;   // compute max |src| (before scaling)
};

// dst[i] = round(src[i] * scale) for any floating dtype; returns max |src[i]| (NaN if any
// element is NaN) when options.want_amax, else 0.
float narrow_from_f32(const float* src, void* dst, DType dst_dtype, int64_t n,
                      const NarrowOptions& options);

// The same rounded to nearest (options.stochastic unset) from a BF16 or F16 source: the codes
// and amax of widen_to_f32 followed by narrow_from_f32, in one pass that widens each vector
// in registers (casts of activations and weights to FP8 need no FP32 copy).
float narrow_from_16bit(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                        const NarrowOptions& options);

}  // namespace mantissa::core
