// Which device this rank computes on: run.device, the visible GPUs and the local rank.
#pragma once

#include <memory>
#include <string>

#include "config.pb.h"
#include "core/ops/backend.h"

namespace mantissa::launcher {

struct DeviceInfo {
  bool cuda = false;
  int index = 0;               // GPU = local rank modulo the visible devices
  std::string name;            // "CPU (2 threads)", or the GPU's name
  int compute_capability = 0;  // major * 10 + minor; 0 on the CPU
  std::string pci_address;     // the GPU's (cudaDeviceGetPCIBusId: the same in every process)
                               // or "" where unknown
};

// CPU when run.device is CPU, or AUTO without a visible GPU; otherwise GPU
// local_rank % device count. Throws core::ConfigError when run.device is CUDA and there is no GPU,
// or when what the config asks does not fit the device (FP8_HYBRID without FP8 tensor cores,
// NCCL on a CPU rank, MPI gradient reduction on a GPU rank).
DeviceInfo select_device(const TrainConfig& config, int local_rank);

std::unique_ptr<core::Backend> make_backend(const DeviceInfo& device);

}  // namespace mantissa::launcher
