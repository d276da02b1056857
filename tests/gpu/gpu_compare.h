// What the gpu tests share: both backends and moving tensors between them, random operands,
// and the comparisons of a GPU result (brought back to the host) with the CPU's.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/ops/backend.h"
#include "tests/common/test_util.h"

namespace mantissa::core::gpu_test {

// ---------------------------------------------------------------------------------------
// Both backends, and moving tensors between them.

struct Backends {
  std::unique_ptr<Backend> cpu = make_cpu_backend();
  std::unique_ptr<Backend> gpu = make_cuda_backend(0);
  Device device = gpu->device();

  Tensor to_device(const Tensor& host) {
    Tensor t = Tensor::empty(host.shape(), host.dtype(), device);
    gpu->copy(host, t);
    return t;
  }
  // Waits for the device, so the result can be read at once.
  Tensor to_host(const Tensor& on_device) {
    Tensor t = Tensor::empty(on_device.shape(), on_device.dtype());
    gpu->copy(on_device, t);
    gpu->synchronize();
    return t;
  }
  // An output on each backend, filled with NaN (floats) or a sentinel (integers).
  std::pair<Tensor, Tensor> poisoned(const Shape& shape, DType dtype) {
    Tensor host = Tensor::empty(shape, dtype);
    Tensor dev = Tensor::empty(shape, dtype, device);
    const bool integer = dtype == DType::kI32 || dtype == DType::kI64 || dtype == DType::kU8;
    cpu->fill(host, integer ? 77.0f : NAN);
    gpu->fill(dev, integer ? 77.0f : NAN);
    return {host, dev};
  }
  // A copy of a host tensor, so that an in-place op on each backend starts from equal data.
  Tensor clone_host(const Tensor& host) {
    Tensor t = Tensor::empty(host.shape(), host.dtype());
    cpu->copy(host, t);
    return t;
  }
};

// What a test skipped for want of FP8 GEMMs (fp8_gemms_supported below) says.
inline constexpr const char* kNoFp8TensorCores = "FP8 needs compute capability 8.9 or newer";

// Whether the device runs FP8 GEMMs (FP8 tensor cores: compute capability 8.9 or newer), from a
// 16x16 E4M3 product. A device without them must refuse it with the backend's message; any
// other error fails the calling test, so that a broken FP8 GEMM is not mistaken for an old GPU.
inline bool fp8_gemms_supported(Backend& gpu) {
  Tensor a = Tensor::empty(Shape{16, 16}, DType::kE4M3, gpu.device());
  Tensor b = Tensor::empty(Shape{16, 16}, DType::kE4M3, gpu.device());
  Tensor c = Tensor::empty(Shape{16, 16}, DType::kF32, gpu.device());
  gpu.fill(a, 1.0f);
  gpu.fill(b, 1.0f);
  GemmParams p;
  p.trans_b = true;
  try {
    gpu.gemm(a, b, c, p);
    gpu.synchronize();
    return true;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("FP8 tensor cores"), std::string::npos) << e.what();
    return false;
  }
}

// Whether a reason unsupported_flash_attention gives is the device's shared memory per block
// (an sm_86 or sm_89 GPU keeps the materialised attention): the one reason a flash test may
// skip for.
inline bool lacks_flash_shared_memory(const std::string& unsupported) {
  return unsupported.find("bytes of shared memory per block") != std::string::npos;
}

// Random normal values times a magnitude drawn per element from `magnitudes`, stored in
// `dtype` (rounded as dtype.h rounds).
inline Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng,
                            std::vector<float> magnitudes = {1.0f}) {
  Tensor t = Tensor::empty(shape, dtype);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<size_t> pick(0, magnitudes.size() - 1);
  for (int64_t i = 0; i < t.numel(); ++i)
    set_code(t, i, encode(dtype, normal(rng) * magnitudes[pick(rng)]));
  return t;
}

inline Tensor tokens_tensor(const Shape& shape, int32_t vocab, std::mt19937_64& rng) {
  Tensor t = Tensor::empty(shape, DType::kI32);
  std::uniform_int_distribution<int32_t> token(0, vocab - 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.data_as<int32_t>()[i] = token(rng);
  return t;
}

// ---------------------------------------------------------------------------------------
// Comparisons. `expected` is the CPU's host tensor, `actual` the GPU's (brought back).

inline std::string hex(uint64_t code) {
  std::ostringstream out;
  out << "0x" << std::hex << code;
  return out.str();
}

// The same bit pattern in every element. The one exception is a NaN in an F32 result: FP32
// arithmetic on a NaN keeps its payload on x86 but gives the canonical 0x7FFFFFFF on NVIDIA
// GPUs, so there any NaN matches any NaN. (Narrower formats encode every NaN as one
// canonical code on both, so their NaNs must match bit for bit.)
inline void expect_same_bits(const Tensor& expected, const Tensor& actual,
                             const std::string& what) {
  ASSERT_EQ(expected.dtype(), actual.dtype()) << what;
  ASSERT_EQ(expected.numel(), actual.numel()) << what;
  const bool f32 = expected.dtype() == DType::kF32;
  int64_t mismatches = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const uint64_t e = code_at(expected, i);
    const uint64_t a = code_at(actual, i);
    const bool both_nan =
        f32 && std::isnan(value_at(expected, i)) && std::isnan(value_at(actual, i));
    if (e != a && !both_nan && ++mismatches <= 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << hex(a) << " on the GPU, " << hex(e)
                    << " on the CPU";
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": elements that differ, of " << expected.numel();
}

// Equal values, any NaN matching any NaN (NaN payloads may differ where an op does not
// define them, as for amax).
inline void expect_same_values(const Tensor& expected, const Tensor& actual,
                               const std::string& what) {
  ASSERT_EQ(expected.numel(), actual.numel()) << what;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const float e = value_at(expected, i);
    const float a = value_at(actual, i);
    if (std::isnan(e)) {
      EXPECT_TRUE(std::isnan(a)) << what << ": element " << i << " is " << a << ", not NaN";
    } else {
      EXPECT_EQ(float_to_bits(e), float_to_bits(a))
          << what << ": element " << i << " is " << a << " on the GPU, " << e << " on the CPU";
    }
  }
}

inline double tolerance(DType dtype) {
  switch (dtype) {
    case DType::kBF16: return 1e-2;
    case DType::kF16: return 2e-3;
    default: return 1e-5;
  }
}

// after - before, element by element, as an F32 host tensor (the two of one shape).
inline Tensor difference(const Tensor& after, const Tensor& before) {
  Tensor d = Tensor::empty(after.shape(), DType::kF32);
  for (int64_t i = 0; i < d.numel(); ++i) {
    set_value(d, i, static_cast<float>(value_at(after, i) - value_at(before, i)));
  }
  return d;
}

// The root mean square of a host tensor's finite elements (0 when there are none).
inline double rms_of(const Tensor& t) {
  double squares = 0.0;
  int64_t finite = 0;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double v = value_at(t, i);
    if (std::isfinite(v)) {
      squares += v * v;
      ++finite;
    }
  }
  return finite > 0 ? std::sqrt(squares / static_cast<double>(finite)) : 0.0;
}

// |actual - expected| <= tol * max(|expected|, rms(expected)); the RMS floor keeps near-zero
// results of a cancellation from demanding more relative accuracy than the computation has.
// NaN must meet NaN, inf the same inf.
inline void expect_close(const Tensor& expected, const Tensor& actual, double tol,
                         const std::string& what) {
  ASSERT_EQ(expected.numel(), actual.numel()) << what;
  const double rms = rms_of(expected);
  int64_t mismatches = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double e = value_at(expected, i);
    const double a = value_at(actual, i);
    const bool ok = std::isfinite(e) ? std::fabs(a - e) <= tol * std::max(std::fabs(e), rms)
                                     : (std::isnan(e) ? std::isnan(a) : a == e);
    if (!ok && ++mismatches <= 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << a << " on the GPU, " << e
                    << " on the CPU (tolerance " << tol << " relative, rms " << rms << ")";
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": elements out of tolerance, of " << expected.numel();
}

// The same with tol from actual's dtype.
inline void expect_close(const Tensor& expected, const Tensor& actual, const std::string& what) {
  expect_close(expected, actual, tolerance(actual.dtype()), what);
}

}  // namespace mantissa::core::gpu_test
