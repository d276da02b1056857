// dtype.h's device code against CUDA's own conversions, exhaustively: every one of the 2^32
// FP32 bit patterns through FP32 -> E4M3 / E5M2 (saturating and not), BF16 and F16, and every
// code back to FP32. Codes must be identical; where both sides produce a NaN they count as
// equal (NaN payloads are not part of the contract). The comparisons run on the GPU
// (gpu_dtype_kernels.cu); together with test_dtype.cpp's host checks of the same functions
// this pins the CPU backend's conversions to the hardware's bit for bit.
//
// Built in every build; without CUDA (or without a device) every test reports
// "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <iomanip>
#include <sstream>
#include <string>

#include "core/ops/backend.h"
#include "tests/gpu/gpu_dtype_kernels.h"

namespace mantissa::core::gpu_dtype_test {
namespace {

#if defined(MANTISSA_WITH_CUDA)
std::string hex(uint32_t v) {
  std::ostringstream out;
  out << "0x" << std::hex << std::setw(8) << std::setfill('0') << v;
  return out.str();
}
#endif

class GpuEncoding : public ::testing::TestWithParam<Encoding> {};

TEST_P(GpuEncoding, EveryFloatMatchesCuda) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
#if defined(MANTISSA_WITH_CUDA)
  const Report report = compare_encoding(GetParam());
  EXPECT_EQ(report.checked, uint64_t{1} << 32);
  EXPECT_EQ(report.mismatches, 0u)
      << "first mismatch: input " << hex(report.first_input) << ", dtype.h gives "
      << hex(report.ours) << ", CUDA " << hex(report.cuda);
#endif
}

std::string encoding_name(const ::testing::TestParamInfo<Encoding>& info) {
  static const char* const kNames[] = {"E4M3SatFinite", "E4M3NoSat", "E5M2SatFinite",
                                       "E5M2NoSat",     "BF16",      "F16"};
  return kNames[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(AllFormats, GpuEncoding,
                         ::testing::Values(Encoding::kE4M3SatFinite, Encoding::kE4M3NoSat,
                                           Encoding::kE5M2SatFinite, Encoding::kE5M2NoSat,
                                           Encoding::kBF16, Encoding::kF16),
                         encoding_name);

class GpuDecoding : public ::testing::TestWithParam<Decoding> {};

TEST_P(GpuDecoding, EveryCodeMatchesCuda) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
#if defined(MANTISSA_WITH_CUDA)
  const Report report = compare_decoding(GetParam());
  const bool fp8 = GetParam() == Decoding::kE4M3 || GetParam() == Decoding::kE5M2;
  EXPECT_EQ(report.checked, fp8 ? 256u : 65536u);
  EXPECT_EQ(report.mismatches, 0u)
      << "first mismatch: code " << hex(report.first_input) << ", dtype.h gives "
      << hex(report.ours) << ", CUDA " << hex(report.cuda);
#endif
}

std::string decoding_name(const ::testing::TestParamInfo<Decoding>& info) {
  static const char* const kNames[] = {"E4M3", "E5M2", "BF16", "F16"};
  return kNames[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(AllFormats, GpuDecoding,
                         ::testing::Values(Decoding::kE4M3, Decoding::kE5M2, Decoding::kBF16,
                                           Decoding::kF16),
                         decoding_name);

}  // namespace
}  // namespace mantissa::core::gpu_dtype_test
