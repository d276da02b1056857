#include "dist/dist_config.h"

#include <charconv>
#include <cmath>
#include <string>
#include <string_view>

#include "core/error.h"

namespace mantissa::dist {
namespace {

// The shortest text that reads back as `value` (as the config layer prints numbers).
std::string format_number(double value) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, end);
}

void require(bool ok, std::string_view field, const std::string& value, std::string_view rule) {
  if (!ok) {
    throw core::ConfigError("dist." + std::string(field) + " = " + value + ": " +
                            std::string(rule));
  }
}

}  // namespace

void validate(const DistConfig& config) {
  const CommBackend b = config.backend;
  require(b == CommBackend::kAuto || b == CommBackend::kMPI || b == CommBackend::kNCCL, "backend",
          std::to_string(static_cast<int>(b)), "must be AUTO, MPI or NCCL");
  const core::DType d = config.grad_reduce_dtype;
  require(d == core::DType::kF32 || d == core::DType::kBF16 || d == core::DType::kF16 ||
              d == core::DType::kE4M3 || d == core::DType::kE5M2,
          "grad_reduce_dtype", reduce_dtype_name(d),
          "must be FP32, BF16, FP16, FP8_E4M3 or FP8_E5M2");
  // The upper bound (64 GiB) keeps the bucket's element count, bucket_mb MiB / 4 bytes, an int64.
  require(std::isfinite(config.bucket_mb) && config.bucket_mb > 0.0 && config.bucket_mb <= 65536.0,
          "bucket_mb", format_number(config.bucket_mb), "must lie in (0, 65536]");
  require(config.zero_stage >= 0 && config.zero_stage <= 1, "zero_stage",
          std::to_string(config.zero_stage), "must lie in [0, 1]");
  require(std::isfinite(config.timeout_s) && config.timeout_s > 0.0, "timeout_s",
          format_number(config.timeout_s), "must be > 0");
  require(config.consistency_check_every >= 0, "consistency_check_every",
          std::to_string(config.consistency_check_every), "must be >= 0");
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
