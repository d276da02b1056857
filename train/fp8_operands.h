// The scaling factors of every FP8 GEMM operand of a model, kept on the device.
//
// Each operand (a Linear layer's input, weight or output gradient) has a slot holding its
// quantize factor `scale`, the dequantize factor `scale_inv` = 1 / scale that the GEMM takes,
// and the largest amax of its uses since the step began (every micro-batch's: the step's amax,
// as Transformer Engine records it). The slots of all operands are three
// contiguous device arrays, so a step reads all amaxes with one copy (and data parallelism
// MAX-reduces them in one collective) before the host-side scaling state (amax histories,
// recipe) computes the next scales and uploads them with one copy.
//
// The block recipes (BLOCKWISE, ROWWISE, MXFP8; core/precision/fp8_scaling.h) scale each
// operand by its own blocks where it is quantized (quantize_operand): their slots only record
// the amax, for the log and metrics, and their scales stay 1.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/ops/fp8_operand.h"
#include "core/precision/fp8_scaling.h"

namespace mantissa::train {

class Fp8Operands {
 public:
  // Registers an operand of the given role; returns its slot. Its format follows from the
  // role when allocate() sees the config: E4M3 for inputs and weights, grad_format for
  // gradients.
  int add(const std::string& name, core::Fp8Role role);
  // Creates the scaling state and the device arrays (every scale starts at 1).
  void allocate(core::Backend& backend, const core::Fp8ScalingConfig& config = {});

  const core::Fp8ScalingConfig& config() const { return registry_->config(); }
  bool block_scaled() const { return core::is_block_recipe(config().recipe); }
  core::DType format(int slot) const { return formats_[slot]; }

  // A training step begins: the slots' amaxes start again from 0 (what uses outside steps,
  // such as an evaluation, recorded does not count toward the step's).
  void begin_step(core::Backend& backend);

  // Per-tensor recipes: dst = round(src * scale) in the slot's format (saturating), adding
  // max |src| to the slot's amax. With the CURRENT recipe the scale is first derived from this
  // tensor's own amax, on the device (Backend::fp8_scale_from_amax: no host round trip).
  void quantize(core::Backend& backend, int slot, const core::Tensor& src, core::Tensor& dst);
  const core::Tensor& scale_inv(int slot) const { return scale_inv_views_[slot]; }

  // Block recipes: src[rows, K] (or src[K, rows]^T with `transpose`) quantized in the slot's
  // role's scale mode and format (Backend::quantize_blocks), adding max |src| to the slot's
  // amax.
  core::Fp8Operand quantize_operand(core::Backend& backend, int slot, const core::Tensor& src,
                                    bool transpose = false);

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
  std::vector<core::Fp8Role> roles_;
  std::vector<core::DType> formats_;  // set by allocate()
  std::unique_ptr<core::Fp8ScalingRegistry> registry_;
  core::Tensor scale_, scale_inv_, amax_;  // F32 [size] on the device
  core::Tensor use_amax_;                  // F32 [size]: CURRENT's amax of the use being quantized
  std::vector<core::Tensor> scale_views_, scale_inv_views_, amax_views_, use_amax_views_;
};

}  // namespace mantissa::train
