#include "core/device_peaks.h"

#include <utility>

namespace mantissa::core {

double gpu_bf16_peak_flops(std::string_view device_name) {
  // Dense (no sparsity) BF16 tensor-core peaks from the vendors' data sheets. Order matters:
  // the first substring that matches wins, so the more specific names come first.
  static const std::pair<std::string_view, double> kPeaks[] = {
      {"H200", 989e12}, {"H100 NVL", 835e12}, {"H100 PCIe", 756e12}, {"H100", 989e12},
      {"H800", 989e12}, {"A100", 312e12},     {"A800", 312e12},      {"L40S", 362e12},
  };
  for (const auto& [name, peak] : kPeaks) {
    if (device_name.find(name) != std::string_view::npos) return peak;
  }
  return 0;
}

double cpu_nominal_peak_flops(int threads) {
  constexpr double kFlopsPerCycle = 2 /* FMA units */ * 8 /* fp32 lanes */ * 2 /* mul+add */;
  constexpr double kHertz = 3e9;
  return (threads > 0 ? threads : 1) * kFlopsPerCycle * kHertz;
}

}  // namespace mantissa::core
