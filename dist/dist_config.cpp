#include "dist/dist_config.h"

#include <cmath>
#include <string>

#include "core/config_check.h"

namespace mantissa::dist {

void validate(const DistConfig& config) {
  const CommBackend b = config.backend;
  core::require(b == CommBackend::kAuto || b == CommBackend::kMPI || b == CommBackend::kNCCL,
                "dist.backend", std::to_string(static_cast<int>(b)), "must be AUTO, MPI or NCCL");
  const core::DType d = config.grad_reduce_dtype;
  core::require(d == core::DType::kF32 || d == core::DType::kBF16 || d == core::DType::kF16 ||
                    d == core::DType::kE4M3 || d == core::DType::kE5M2,
                "dist.grad_reduce_dtype", reduce_dtype_name(d),
                "must be FP32, BF16, FP16, FP8_E4M3 or FP8_E5M2");
  // The upper bound (64 GiB) keeps the bucket's element count, bucket_mb MiB / 4 bytes, an int64.
  core::require(
      std::isfinite(config.bucket_mb) && config.bucket_mb > 0.0 && config.bucket_mb <= 65536.0,
      "dist.bucket_mb", core::format_number(config.bucket_mb), "must lie in (0, 65536]");
  core::in_range("dist.zero_stage", config.zero_stage, 0, 1);
  // Below a second, a healthy job's start or a step on a busy host ends in a timeout that
  // blames a rank.
  core::require(std::isfinite(config.timeout_s) && config.timeout_s >= 1.0, "dist.timeout_s",
                core::format_number(config.timeout_s), "must be a finite number >= 1 (seconds)");
  core::at_least("dist.consistency_check_every", config.consistency_check_every, 0);
}

void validate_for_gpu(const DistConfig& config, int compute_capability, const std::string& device) {
  const core::DType d = config.grad_reduce_dtype;
  const bool fp8_sums =
      (d == core::DType::kE4M3 || d == core::DType::kE5M2) && !config.accumulate_fp32;
  core::require(
      !fp8_sums || compute_capability >= 90, "dist.grad_reduce_dtype", reduce_dtype_name(d),
      "NCCL sums FP8 only on compute capability 9.0 or newer, and " + device + " has " +
          std::to_string(compute_capability / 10) + "." + std::to_string(compute_capability % 10) +
          ": reduce in BF16, or set dist.accumulate_fp32 = true (FP8 is then only sent, "
          "and summed in FP32)");
}

const char* reduce_dtype_name(core::DType dtype) {
  switch (dtype) {
    case core::DType::kF32: return "FP32";
    case core::DType::kBF16: return "BF16";
    case core::DType::kF16: return "FP16";
    case core::DType::kE4M3: return "FP8_E4M3";
    case core::DType::kE5M2: return "FP8_E5M2";
    default: return core::dtype_name(dtype);
  }
}

}  // namespace mantissa::dist
