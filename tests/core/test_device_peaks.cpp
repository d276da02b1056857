// The peaks MFU is quoted against (core/device_peaks.h): the data-sheet BF16 figure of each
// GPU the CUDA runtime may name, the more specific names first, and the CPU yardstick.
#include <gtest/gtest.h>

#include "core/device_peaks.h"

namespace mantissa::core {
namespace {

TEST(DevicePeaks, GpuNamesAsTheRuntimeGivesThem) {
  EXPECT_EQ(gpu_bf16_peak_flops("NVIDIA H100 80GB HBM3"), 989e12);
  EXPECT_EQ(gpu_bf16_peak_flops("NVIDIA H200"), 989e12);
  EXPECT_EQ(gpu_bf16_peak_flops("NVIDIA H100 PCIe"), 756e12);
  EXPECT_EQ(gpu_bf16_peak_flops("NVIDIA H100 NVL"), 835e12);
  EXPECT_EQ(gpu_bf16_peak_flops("NVIDIA A100-SXM4-80GB"), 312e12);
  EXPECT_EQ(gpu_bf16_peak_flops("Some Future GPU"), 0.0);
}

TEST(DevicePeaks, CpuYardstick) {
  EXPECT_EQ(cpu_nominal_peak_flops(2), 2 * 96e9);
  EXPECT_EQ(cpu_nominal_peak_flops(0), 96e9);
}

}  // namespace
}  // namespace mantissa::core
