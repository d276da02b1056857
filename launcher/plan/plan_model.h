// The analytic model behind `mantissa plan`: what a run of a config needs per device (memory)
// and how long its step takes on a cluster, from the model's shapes, the device's peaks and
// the network, without building anything.
//
// Step time = compute + memory-bound passes + the communication backward does not hide:
//   compute    FLOPs per rank (6 per parameter per token + 6 L C T for attention, as MFU
//              counts them) at the device's peak for each GEMM's precision (FP8 for the block
//              linears under FP8_HYBRID, else the compute dtype's), divided by the efficiency;
//              ranks that share cores (--cores) get their share of them
//   memory     the passes whose cost does not grow with the tokens, at the memory bandwidth
//              (with the ranks' share of shared cores): AdamW over its (ZeRO-1: sharded)
//              masters, moments, gradients and compute copy, zeroing the gradients, and the
//              sync's casts to the reduce dtype and back
//   exposed    the gradient buckets (dist.bucket_mb of FP32 gradients each, filled in reverse
//              parameter order) each become ready when backward of the last micro-batch has
//              passed their parameters (backward is 2/3 of the compute, its progress taken as
//              proportional to the parameters passed) and are reduced one after another, each
//              a ring all-reduce (or reduce-scatter + all-gather under ZeRO-1): 2 (N-1)/N of
//              its bytes in the reduce dtype cross the slowest link of the ring, plus a
//              latency of 2 log2 N steps; what is still running when backward ends is exposed
//              (everything, with dist.overlap false)
// The slowest link: within a node the device's own (NVLink; for CPU ranks sharing a node,
// --node-gbps); across nodes each device's share of its node's network.
//
// Memory per device, in bytes: FP32 masters and AdamW moments (ZeRO-1: a 1/N share each),
// FP32 gradients (always whole), the compute copy, the reduce dtype's copy of the gradients,
// FP8 weight copies, the activations backward keeps (counted from what each layer saves,
// the LM head's logit gradients among them), the larger of two passing peaks on top of them
// (one layer's backward working set, and the FP32 logits that the loss reads while it writes
// the logit gradients, in every mode but FP32, where it writes them in place), on CPUs outside
// FP32 the BF16 GEMM kernels' kept copy of their largest operand (the logit gradients), and a
// fixed runtime allowance: on GPUs the CUDA context, cuBLASLt workspace and NCCL buffers; on
// CPUs what a process of a tiny model holds (libraries, OpenBLAS's and OpenMP's buffers).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.pb.h"
#include "launcher/plan/plan_devices.h"

namespace mantissa::launcher {

// The shapes that decide a model's cost, from its config section.
struct ModelCost {
  std::string family;                   // "GPT-2", "Llama"
  int64_t parameters = 0;               // the model's own (vocabulary padding excluded)
  int64_t flat_parameters = 0;          // the flat buffers' (padding included)
  int64_t block_linear_parameters = 0;  // the weights FP8_HYBRID multiplies in FP8
  double flops_per_token = 0;
  // Bytes backward keeps per token: those of elements stored in the compute dtype, those
  // stored in FP8 instead under FP8_HYBRID's per-tensor recipes (the block linears' inputs),
  // and those stored in FP32 whatever the mode.
  double saved_elements_per_token = 0;
  double fp8_saved_elements_per_token = 0;
  double fp32_saved_bytes_per_token = 0;
  double working_elements_per_token = 0;  // one layer's backward, compute dtype
  // The LM head's logits per token (the padded vocabulary), FP32 whatever the mode.
  double logit_elements_per_token = 0;
  // Attention's part of those, per layer and token: the probabilities P [B, H, T, T] that the
  // materialised attention keeps (H T elements; in the working set too), and for flash
  // attention (core/ops/flash_attention_switch.h) instead lse [B, H, T] (4 H bytes) and its
  // output (the attention width), which the output projection keeps anyway unless it keeps
  // an FP8 copy.
  int64_t layers = 0;
  int64_t head_dim = 0;
  double probability_elements = 0;
  double lse_bytes = 0;
  double attention_output_elements = 0;
};
// GPT-2 or Llama (the MLP has no plan: it is a test model); throws core::ConfigError otherwise.
ModelCost model_cost(const TrainConfig::Model& model);

struct Cluster {
  DeviceSpec device;
  int ranks = 1;
  int per_node = 1;
  // CPU ranks only: the cores all ranks share (the test cluster's hosts are one machine);
  // 0: each rank has cores of its own.
  int shared_cores = 0;
};

struct MemoryEstimate {
  double masters = 0, optimizer = 0, gradients = 0, weights = 0, reduce = 0, fp8 = 0;
  double activations = 0;  // what forward keeps for backward, one micro-batch
  double working = 0;      // the passing peak on top of it: a layer's backward, or the logits
  double runtime = 0;
  double total() const {
    return masters + optimizer + gradients + weights + reduce + fp8 + activations + working +
           runtime;
  }
};

struct StepEstimate {
  double compute_s = 0, memory_s = 0, comm_s = 0, exposed_s = 0;
  double memory_bytes = 0;  // moved by the memory-bound passes, per rank
  int64_t buckets = 0;
  double gradient_bytes = 0;  // one rank's gradients in the reduce dtype
  double step_s() const { return compute_s + memory_s + exposed_s; }
  int64_t tokens = 0;  // per step, all ranks
  double tokens_per_s() const { return static_cast<double>(tokens) / step_s(); }
  double mfu = 0;  // tokens/s x FLOPs per token over the ranks' BF16 peaks
};

// "" when the device has flash-attention kernels for the run's attention, else why not; the
// rule of the CUDA backend's unsupported_flash_attention for a device known by name: BF16 and
// F16 (FP8_HYBRID's attention is BF16) with heads of 64 channels, or 128 on Hopper (an A100's
// 163 KiB of shared memory per block is too little for the 128-channel backward). The CPU
// has flash for any shape.
std::string missing_flash_kernels(const TrainConfig& config, const ModelCost& cost,
                                  const DeviceSpec& device);
// Whether the run's attention is flash attention (core/ops/flash_attention_switch.h's rule).
bool uses_flash_attention(const TrainConfig& config, const ModelCost& cost,
                          const DeviceSpec& device);

// The config's precision and dist sections decide what is computed how; `config` has its
// defaults applied and is validated.
MemoryEstimate estimate_memory(const TrainConfig& config, const ModelCost& cost,
                               const Cluster& cluster);
StepEstimate estimate_step(const TrainConfig& config, const ModelCost& cost,
                           const Cluster& cluster);

}  // namespace mantissa::launcher
