// Helpers shared by the backend op tests (tests/core/test_cpu_*.cpp, tests/gpu/test_gpu_ops.cpp):
// element access on host tensors by dtype, NaN poisoning, scalar operands, half-ulp bounds,
// thread-count control and error-message checks. Header-only, since every test is its own
// executable.
#pragma once

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

inline constexpr DType kFloatTypes[] = {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3,
                                        DType::kE5M2};

// ---------------------------------------------------------------------------------------
// Element access by dtype. Storing goes through the scalar conversions of dtype.h (checked
// on their own in test_dtype.cpp); reading decodes exactly.

inline uint32_t encode(DType d, float v, Saturation sat = Saturation::kSatFinite) {
  switch (d) {
    case DType::kF32: return float_to_bits(v);
    case DType::kBF16: return bf16_from_float(v).bits;
    case DType::kF16: return fp16_from_float(v).bits;
    case DType::kE4M3: return e4m3_from_float(v, sat).bits;
    case DType::kE5M2: return e5m2_from_float(v, sat).bits;
    default: ADD_FAILURE() << "encode: not a float dtype"; return 0;
  }
}

inline double decode(DType d, uint32_t code) {
  switch (d) {
    case DType::kF32: return bits_to_float(code);
    case DType::kBF16: return bf16_to_float(bf16{static_cast<uint16_t>(code)});
    case DType::kF16: return fp16_to_float(fp16{static_cast<uint16_t>(code)});
    case DType::kE4M3: return e4m3_to_float(fp8_e4m3{static_cast<uint8_t>(code)});
    case DType::kE5M2: return e5m2_to_float(fp8_e5m2{static_cast<uint8_t>(code)});
    default: ADD_FAILURE() << "decode: not a float dtype"; return 0;
  }
}

// The bit pattern of element i, for any dtype (up to 8 bytes wide).
inline uint64_t code_at(const Tensor& t, int64_t i) {
  uint64_t code = 0;
  const size_t width = dtype_size(t.dtype());
  std::memcpy(&code, static_cast<const unsigned char*>(t.data()) + i * width, width);
  return code;
}

inline void set_code(Tensor& t, int64_t i, uint64_t code) {
  const size_t width = dtype_size(t.dtype());
  std::memcpy(static_cast<unsigned char*>(t.data()) + i * width, &code, width);
}

inline double value_at(const Tensor& t, int64_t i) {
  return decode(t.dtype(), static_cast<uint32_t>(code_at(t, i)));
}

// Without saturation, so that an input out of range shows up as inf or NaN.
inline void set_value(Tensor& t, int64_t i, float v) {
  set_code(t, i, encode(t.dtype(), v, Saturation::kNoSat));
}

inline std::vector<double> values_of(const Tensor& t) {
  std::vector<double> out(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = value_at(t, i);
  return out;
}

// Fills an output with NaN before a call, so that an element the op forgets to write cannot
// pass a comparison.
inline void poison(Tensor& t) {
  uint32_t nan_code = 0;
  switch (t.dtype()) {
    case DType::kF32: nan_code = 0x7FC00000u; break;
    case DType::kBF16: nan_code = 0x7FC0u; break;
    case DType::kF16: nan_code = 0x7E00u; break;
    case DType::kE4M3: nan_code = 0x7Fu; break;
    case DType::kE5M2: nan_code = 0x7Eu; break;
    default: FAIL() << "poison: not a float dtype";
  }
  for (int64_t i = 0; i < t.numel(); ++i) set_code(t, i, nan_code);
}

// 1-element host tensors, the form of the ops' scale, amax, norm and index operands.
inline Tensor f32_scalar(float value) {
  Tensor t = Tensor::empty(Shape{1}, DType::kF32);
  t.data_as<float>()[0] = value;
  return t;
}

inline Tensor i64_scalar(int64_t value) {
  Tensor t = Tensor::empty(Shape{1}, DType::kI64);
  t.data_as<int64_t>()[0] = value;
  return t;
}

// ---------------------------------------------------------------------------------------
// Rounding bounds.

// Where a format's rounding grid is: stored mantissa bits and the exponent of its smallest
// normal (below it the spacing stays that of the subnormals), and of its largest binade.
struct Grid {
  int man_bits;
  int min_exp;
  int max_exp;
};

inline Grid grid_of(DType d) {
  switch (d) {
    case DType::kF32: return {23, -126, 127};
    case DType::kBF16: return {7, -126, 127};
    case DType::kF16: return {10, -14, 15};
    case DType::kE4M3: return {3, -6, 8};
    case DType::kE5M2: return {2, -14, 15};
    default: ADD_FAILURE() << "grid_of: not a float dtype"; return {0, 0, 0};
  }
}

// Half the spacing of d's representable values around |y|: the largest error of a rounding to
// nearest.
inline double half_ulp(DType d, double y) {
  const Grid g = grid_of(d);
  const int e = y == 0.0 ? g.min_exp : std::max(std::ilogb(y), g.min_exp);
  return std::ldexp(1.0, e - g.man_bits - 1);
}

// The larger of a running worst error and a new one, a NaN error (a NaN result, or an element
// left poisoned) counting as infinite: std::max(worst, NaN) would keep `worst` and let it pass.
inline double worse_error(double worst, double error) {
  return std::isnan(error) ? INFINITY : std::max(worst, error);
}

// ---------------------------------------------------------------------------------------
// Running ops.

// Runs f with `threads` OpenMP threads, then restores the previous setting.
inline void with_threads(int threads, const std::function<void()>& f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(threads);
  f();
  omp_set_num_threads(saved);
}

// f throws core::Error, and its message contains each of `words`.
inline void expect_error(const std::function<void()>& f, std::initializer_list<const char*> words) {
  try {
    f();
    ADD_FAILURE() << "expected an Error";
  } catch (const Error& e) {
    for (const char* w : words) {
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos)
          << "message \"" << e.what() << "\" does not mention \"" << w << "\"";
    }
  }
}

// Sets (or, with nullptr, unsets) an environment variable for one scope, then restores what
// was there, also when the scope ends by an exception.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) saved_ = std::string(old);
    set(value);
  }
  ~ScopedEnv() { set(saved_ ? saved_->c_str() : nullptr); }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  void set(const char* value) {
    if (value) {
      setenv(name_.c_str(), value, 1);
    } else {
      unsetenv(name_.c_str());
    }
  }
  std::string name_;
  std::optional<std::string> saved_;
};

}  // namespace mantissa::core
