// How data parallelism is configured (the `dist` section of the config), and the one place
// that checks its value ranges: DataParallel::create and the config layer both call validate(),
// so a bad value is reported with the same words wherever it is caught.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor/tensor.h"

namespace mantissa::dist {

enum class CommBackend { kAuto, kMPI, kNCCL };

struct DistConfig {
  CommBackend backend = CommBackend::kAuto;            // AUTO: NCCL for a CUDA device, else MPI
  core::DType grad_reduce_dtype = core::DType::kBF16;  // F32, BF16, F16, E4M3 or E5M2
  bool accumulate_fp32 = false;           // reduce-scatter summed in FP32, then all-gather
  double bucket_mb = 25.0;                // MiB of FP32 gradients per bucket, in (0, 65536]
  bool overlap = true;                    // start buckets during backward (else all in finish())
  int zero_stage = 0;                     // 0 or 1
  double timeout_s = 300.0;               // >= 1
  int64_t consistency_check_every = 100;  // >= 0; 0: only before checkpoints

  bool operator==(const DistConfig&) const = default;
};

// Throws core::ConfigError for the first value out of its range, in the config layer's words:
// "dist.<field> = <value>: <rule>", e.g. "dist.bucket_mb = 0: must lie in (0, 65536]".
void validate(const DistConfig& config);

// What a GPU of compute capability `compute_capability` (major * 10 + minor; `device` names
// it) can run of this config. NCCL sums FP8 only on 9.0 and newer; with accumulate_fp32 the
// FP8 gradients are only moved (all-to-all, all-gather) and summed in FP32 by each rank, which
// any GPU does. Throws core::ConfigError naming dist.grad_reduce_dtype otherwise.
void validate_for_gpu(const DistConfig& config, int compute_capability, const std::string& device);

// "FP8_E4M3", ... as in the config (dist.grad_reduce_dtype).
const char* reduce_dtype_name(core::DType dtype);

}  // namespace mantissa::dist
