// The scaling factors of every FP8 GEMM operand of a model, kept on the device.
//
// Each operand (a Linear layer's input, weight or output gradient) has a slot holding its
// quantize factor `scale`, the dequantize factor `scale_inv` = 1 / scale that the GEMM takes,
// and the amax recorded when it was last quantized. The slots of all operands are three
// contiguous device arrays, so a step reads all amaxes with one copy (and data parallelism
// MAX-reduces them in one collective) before the host-side scaling state (amax histories,
// recipe) computes the next scales and uploads them with one copy.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/precision/fp8_scaling.h"

namespace mantissa::train {

class Fp8Operands {
 public:
  // Registers an operand quantized to `format` (E4M3 or E5M2); returns its slot.
  int add(const std::string& name, core::DType format);
  // Creates the scaling state and the device arrays (every scale starts at 1).
  void allocate(core::Backend& backend, const core::Fp8ScalingConfig& config = {});

  // dst = round(src * scale) in the slot's format (saturating), recording max |src| in the
  // slot. With the CURRENT recipe the scale is first derived from this tensor's own amax,
  // which costs a host round trip per operand.
  void quantize(core::Backend& backend, int slot, const core::Tensor& src, core::Tensor& dst);
  const core::Tensor& scale_inv(int slot) const { return scale_inv_views_[slot]; }

  int size() const { return static_cast<int>(names_.size()); }
  // This step's amaxes, one per slot in slot order (host copy; synchronises).
  std::vector<float> read_amaxes(core::Backend& backend);
  // Feeds the (already MAX-reduced) amaxes to the scaling state and uploads the new scales.
  void update_scales(core::Backend& backend, const std::vector<float>& amaxes);
  // After a checkpoint restore of registry().state().
  void upload_scales(core::Backend& backend);

  core::Fp8ScalingRegistry& registry() { return *registry_; }

 private:
  std::vector<std::string> names_;
  std::vector<core::DType> formats_;
  std::unique_ptr<core::Fp8ScalingRegistry> registry_;
  core::Tensor scale_, scale_inv_, amax_;  // F32 [size] on the device
  std::vector<core::Tensor> scale_views_, scale_inv_views_, amax_views_;
};

}  // namespace mantissa::train
