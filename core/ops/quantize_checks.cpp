#include "core/ops/quantize_checks.h"

#include "core/error.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

namespace {
constexpr const char* kOp = "quantize_blocks";
}  // namespace

QuantizeDims check_quantize_blocks(const Tensor& src, const Tensor& codes, const Tensor& scales,
                                   const BlockQuantizeParams& p, Device device) {
  MANTISSA_CHECK(p.mode != ScaleMode::kTensor,
                 kOp << ": scale mode " << scale_mode_name(p.mode)
                     << " scales a whole tensor, which cast() does; quantize_blocks takes the "
                        "per-row and per-block modes");
  check_operand(kOp, "src", src, device, {DType::kF32, DType::kBF16, DType::kF16});
  check_operand(kOp, "codes", codes, device, {DType::kE4M3, DType::kE5M2});
  check_operand(kOp, "scales", scales, device, {scale_dtype(p.mode)});
  check_rank(kOp, "src", src, 2);
  QuantizeDims d;
  d.outer = src.dim(p.transpose ? 1 : 0);
  d.k = src.dim(p.transpose ? 0 : 1);
  check_shape(kOp, "codes", codes, Shape{d.outer, d.k});
  check_shape(kOp, "scales", scales, Shape{scale_count(p.mode, d.outer, d.k)});
  if (p.amax != nullptr) check_scalar(kOp, "amax", *p.amax, device);
  check_disjoint(kOp, "codes", codes, "src", src);
  check_disjoint(kOp, "scales", scales, "src", src);
  check_disjoint(kOp, "scales", scales, "codes", codes);
  if (p.amax != nullptr) {
    check_disjoint(kOp, "amax", *p.amax, "src", src);
    check_disjoint(kOp, "amax", *p.amax, "codes", codes);
    check_disjoint(kOp, "amax", *p.amax, "scales", scales);
  }
  return d;
}

}  // namespace mantissa::core
