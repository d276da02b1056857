#include "launcher/plan/plan_devices.h"

#include <algorithm>
#include <cctype>

#include "core/error.h"
#include "core/strings.h"

namespace mantissa::launcher {
namespace {

// NVIDIA's data sheets (SXM parts, dense peaks) and the nodes they ship in (DGX/HGX: 8 GPUs
// on NVLink, one 200 or 400 Gbit/s NIC per GPU). NVLink: A100 600 GB/s, H100/H200 900 GB/s,
// both directions together.
constexpr DeviceSpec kDevices[] = {
    {"a100", "NVIDIA A100 SXM 80GB", 312, 0, 19.5, 80, 2039, 300, 8, 8 * 200, 10, 0.5, 80},
    {"h100", "NVIDIA H100 SXM 80GB", 989, 1979, 67, 80, 3350, 450, 8, 8 * 400, 10, 0.5, 90},
    {"h200", "NVIDIA H200 SXM 141GB", 989, 1979, 67, 141, 4800, 450, 8, 8 * 400, 10, 0.5, 90},
    // A CPU rank: its FP32 FMA peak is the machine's (--tflops, e.g. bench_cpu_gemm's
    // "FMA peak"), and its efficiency is calibrated on a measured run (bench/bench_scaling.sh).
    // Latency: Open MPI over TCP.
    {"cpu", "CPU rank (FMA peak from --tflops)", 0, 0, 0, 0, 0, 0, 1, 0, 50, 0.5},
};

std::string lower(std::string_view s) {
  std::string out(s);
  std::transform(out.begin(), out.end(), out.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return out;
}

}  // namespace

const DeviceSpec& find_device(std::string_view name) {
  const std::string key = lower(name);
  for (const DeviceSpec& d : kDevices) {
    if (d.name == key) return d;
  }
  throw core::ConfigError("--gpu " + std::string(name) +
                          ": unknown device (known: " + device_names() + ")");
}

std::string device_names() {
  return core::join(kDevices, ", ", &DeviceSpec::name);
}

}  // namespace mantissa::launcher
