// The peak FLOP/s that MFU is quoted against, by device: one table for the trainer's metrics and
// the benchmarks.
#pragma once

#include <string_view>

namespace mantissa::core {

// Dense BF16 tensor-core peak FLOP/s of one GPU, looked up by the CUDA device name
// (cudaDeviceProp::name, e.g. "NVIDIA H100 80GB HBM3"); 0 when unknown. MFU is conventionally
// quoted against the BF16 peak (llm.c, Megatron-LM), whatever precision the run uses.
double gpu_bf16_peak_flops(std::string_view device_name);

// A nominal FP32 peak for a CPU rank with `threads` AVX2 cores: 2 FMA units x 8 lanes x 2
// FLOPs per cycle at 3 GHz. Only a yardstick: set metrics.peak_tflops for a real figure.
double cpu_nominal_peak_flops(int threads);

}  // namespace mantissa::core
