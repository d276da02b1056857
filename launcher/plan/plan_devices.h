// The devices `mantissa plan` projects onto: data-sheet peaks (dense, no sparsity), memory and
// the links of a typical node, and the fraction of peak a training step's compute reaches.
#pragma once

#include <string>
#include <string_view>

namespace mantissa::launcher {

struct DeviceSpec {
  std::string_view name;  // as --gpu takes it
  std::string_view description;
  double bf16_tflops = 0;  // BF16/FP16 tensor-core peak; 0: none known (the CPU: --tflops)
  double fp8_tflops = 0;   // FP8 tensor-core peak; 0: no FP8 GEMMs (FP8_HYBRID is refused)
  double fp32_tflops = 0;  // FP32 GEMMs (no TF32), as precision.mode FP32 runs them
  double memory_gib = 0;   // per device; 0: not known (memory is projected, not compared)
  double memory_gbps = 0;  // bytes moved (read + write) per second, GB/s; 0: not known
  double node_gbps = 0;    // GB/s per direction between a device and the rest of its node
  int per_node = 1;        // devices per node
  double link_gbit = 0;    // a node's network, Gbit/s per direction (all its NICs together)
  double latency_us = 0;   // per step of a collective's algorithm over the network
  // The fraction of the peaks the step's compute reaches (its FLOPs over its compute time).
  // Not measured for mantissa on these GPUs yet: llm.c's GPT-2 reaches 46-56% MFU on A100
  // and H100 with the same FLOP count, so 0.5 is where the GPU defaults start.
  double efficiency = 0;
  int compute_capability = 0;  // 10 major + minor (90: Hopper); 0 for the CPU

  // The CPU rank: its peak comes from --tflops, and it has no tensor cores or flash attention.
  bool is_cpu() const { return name == "cpu"; }
};

// The entry for a --gpu name (case-insensitive); throws core::ConfigError naming the known ones.
const DeviceSpec& find_device(std::string_view name);
// "a100, h100, h200, cpu" for help texts and messages.
std::string device_names();

}  // namespace mantissa::launcher
