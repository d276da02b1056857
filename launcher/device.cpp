#include "launcher/device.h"

#include <omp.h>

#include "core/precision/block_scaling.h"
#include "launcher/config/config.h"
#include "launcher/config/config_translate.h"

#ifdef MANTISSA_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace mantissa::launcher {

namespace {

DeviceInfo cpu_device() {
  const int threads = omp_get_max_threads();
  return {false, 0, "CPU (" + std::to_string(threads) + (threads == 1 ? " thread)" : " threads)"),
          0, ""};
}

#ifdef MANTISSA_WITH_CUDA
DeviceInfo gpu_device(int local_rank) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  if (count <= 0) return {};
  const int index = local_rank % count;
  cudaDeviceProp props{};
  if (cudaGetDeviceProperties(&props, index) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  // The address NCCL tells GPUs apart by ("00000000:3B:00.0"); "" where the driver does not
  // say (the ranks then cannot compare GPUs, and NCCL still refuses two on one).
  char pci_address[64] = {};
  if (cudaDeviceGetPCIBusId(pci_address, sizeof pci_address, index) != cudaSuccess) {
    cudaGetLastError();
    pci_address[0] = '\0';
  }
  return {true, index, props.name, props.major * 10 + props.minor, pci_address};
}
#else
DeviceInfo gpu_device(int) {
  return {};
}
#endif

}  // namespace

DeviceInfo select_device(const TrainConfig& config, int local_rank) {
  const TrainConfig::Run::Device wanted = config.run().device();
  DeviceInfo device = cpu_device();
  if (wanted != TrainConfig::Run::CPU && core::cuda_device_available()) {
    const DeviceInfo gpu = gpu_device(local_rank);
    if (gpu.cuda) device = gpu;
  }
  if (wanted == TrainConfig::Run::CUDA) {
#ifdef MANTISSA_WITH_CUDA
    require(device.cuda, "run.device", "CUDA", "no CUDA device is visible to this process");
#else
    require(false, "run.device", "CUDA",
            "this build has no CUDA backend (nvcc was not found or MANTISSA_CUDA=OFF)");
#endif
  }

  if (device.cuda) {
    // What this GPU lacks (the CPU backend emulates FP8 bit for bit, so only a GPU can).
    const std::string gpu = device.name + " on cuda:" + std::to_string(device.index);
    if (config.precision().mode() == TrainConfig::Precision::FP8_HYBRID) {
      const std::string why = core::gpu_scale_mode_rule(
          core::ScaleMode::kTensor, core::ScaleMode::kTensor, device.compute_capability,
          gpu + " (compute capability " + std::to_string(device.compute_capability / 10) + "." +
              std::to_string(device.compute_capability % 10) + ")");
      require(why.empty(), "precision.mode", "FP8_HYBRID", why);
    }
    dist::validate_for_gpu(dist_config(config), device.compute_capability, gpu);
    // MPI reduces host buffers and NCCL device buffers (AUTO picks the one that fits).
    require(config.dist().backend() != TrainConfig::Dist::MPI, "dist.backend", "MPI",
            "reduces host buffers, and this rank runs on " + device.name + " (use NCCL or AUTO)");
  } else {
    require(config.dist().backend() != TrainConfig::Dist::NCCL, "dist.backend", "NCCL",
            "needs a CUDA device, and this rank runs on the CPU (use MPI or AUTO)");
  }
  return device;
}

std::unique_ptr<core::Backend> make_backend(const DeviceInfo& device) {
  return device.cuda ? core::make_cuda_backend(device.index) : core::make_cpu_backend();
}

}  // namespace mantissa::launcher
