#include "core/ops/cpu/cpu_convert.h"

#include <cmath>

#include "core/error.h"

namespace mantissa::core {
namespace {

template <class T>
void widen(const T* src, float* dst, int64_t n, float scale) {
#pragma omp parallel for schedule(static) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]) * scale;
}

template <class T>
float narrow(const float* src, T* dst, int64_t n, const NarrowOptions& o) {
  float amax = 0.0f;
  bool saw_nan = false;
#pragma omp parallel for schedule(static) reduction(max : amax) reduction(|| : saw_nan) if (n > (1 << 16))
  for (int64_t i = 0; i < n; ++i) {
    const float x = src[i];
    if (o.want_amax) {
      saw_nan = saw_nan || std::isnan(x);
      amax = std::fmax(amax, std::fabs(x));
    }
    const float scaled = x * o.scale;
    dst[i] = o.stochastic
                 ? Rounder<T>::stochastic(scaled, random_u32(o.seed, o.index_base + i), o.saturation)
                 : Rounder<T>::nearest(scaled, o.saturation);
  }
  return saw_nan ? NAN : amax;
}

}  // namespace

void widen_to_f32(const void* src, DType src_dtype, float* dst, int64_t n, float scale) {
  switch (src_dtype) {
    case DType::kF32: return widen(static_cast<const float*>(src), dst, n, scale);
    case DType::kBF16: return widen(static_cast<const bf16*>(src), dst, n, scale);
    case DType::kF16: return widen(static_cast<const fp16*>(src), dst, n, scale);
    case DType::kE4M3: return widen(static_cast<const fp8_e4m3*>(src), dst, n, scale);
    case DType::kE5M2: return widen(static_cast<const fp8_e5m2*>(src), dst, n, scale);
    default: MANTISSA_FAIL("widen_to_f32: " << dtype_name(src_dtype) << " is not a float dtype");
  }
}

float narrow_from_f32(const float* src, void* dst, DType dst_dtype, int64_t n,
                      const NarrowOptions& options) {
  switch (dst_dtype) {
    case DType::kF32: return narrow(src, static_cast<float*>(dst), n, options);
    case DType::kBF16: return narrow(src, static_cast<bf16*>(dst), n, options);
    case DType::kF16: return narrow(src, static_cast<fp16*>(dst), n, options);
    case DType::kE4M3: return narrow(src, static_cast<fp8_e4m3*>(dst), n, options);
    case DType::kE5M2: return narrow(src, static_cast<fp8_e5m2*>(dst), n, options);
    default:
      MANTISSA_FAIL("narrow_from_f32: " << dtype_name(dst_dtype) << " is not a float dtype");
  }
}

}  // namespace mantissa::core
