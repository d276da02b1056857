// What the CPU layer-op tests share to check an op against an FP64 reference: host tensors made
// from FP64 values (values_of() in test_util.h reads them back), a tolerance measured on the
// tensor's scale, central finite differences, and "the F32 result rounded once".
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "tests/common/test_util.h"

namespace mantissa::core {

using Vec = std::vector<double>;

// A tensor holding `values` rounded to `dtype`; values_of() it for the exact stored inputs.
inline Tensor make(const Shape& shape, DType dtype, const Vec& values) {
  Tensor t = Tensor::empty(shape, dtype);
  EXPECT_EQ(static_cast<int64_t>(values.size()), t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) set_value(t, i, static_cast<float>(values[i]));
  return t;
}

inline Tensor poisoned(const Shape& shape, DType dtype) {
  return make(shape, dtype, Vec(static_cast<size_t>(shape.numel()), NAN));
}

// Every element within rtol of the reference, measured against max(|ref|, rms(ref)) so that
// elements that happen to be near zero are judged on the scale of the whole tensor. NaN in
// the result (an unwritten element) always fails.
inline void expect_close(const Vec& actual, const Vec& expected, double rtol,
                         const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  double sq = 0.0;
  for (double e : expected) sq += e * e;
  const double rms = std::sqrt(sq / static_cast<double>(std::max<size_t>(expected.size(), 1)));
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    double err =
        std::fabs(actual[i] - expected[i]) / std::max({std::fabs(expected[i]), rms, 1e-300});
    if (std::isnan(err)) err = INFINITY;
    if (err > worst) {
      worst = err;
      worst_i = i;
    }
  }
  EXPECT_LE(worst, rtol) << what << ": element " << worst_i << " is " << actual[worst_i]
                         << ", expected " << expected[worst_i] << " (rms " << rms << ")";
}

inline double dot(const Vec& a, const Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central differences of the scalar f around x, one coordinate at a time. With an FP64 f of
// order-one inputs, h = 1e-6 balances truncation (~h^2) against rounding (~1e-16 / h).
inline Vec finite_difference(const std::function<double(const Vec&)>& f, Vec x) {
  const double h = 1e-6;
  Vec grad(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double xi = x[i];
    x[i] = xi + h;
    const double up = f(x);
    x[i] = xi - h;
    const double down = f(x);
    x[i] = xi;
    grad[i] = (up - down) / (2.0 * h);
  }
  return grad;
}

// Bit patterns of a BF16 or F16 tensor equal round-to-nearest-even of an F32 tensor.
inline void expect_rounded_once(const Tensor& wide, const Tensor& narrow, const std::string& what) {
  ASSERT_EQ(wide.dtype(), DType::kF32);
  ASSERT_TRUE(narrow.dtype() == DType::kBF16 || narrow.dtype() == DType::kF16) << what;
  ASSERT_EQ(wide.numel(), narrow.numel());
  for (int64_t i = 0; i < wide.numel(); ++i) {
    const float w = wide.data_as<float>()[i];
    const uint64_t expected =
        narrow.dtype() == DType::kBF16 ? round_to<bf16>(w).bits : round_to<fp16>(w).bits;
    ASSERT_EQ(code_at(narrow, i), expected)
        << what << ": element " << i << " is not the F32 result rounded once";
  }
}

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace mantissa::core
