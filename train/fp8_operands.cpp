#include "train/fp8_operands.h"

#include "core/error.h"

namespace mantissa::train {

using core::DType;
using core::Shape;
using core::Tensor;

int Fp8Operands::add(const std::string& name, core::Fp8Role role) {
  MANTISSA_CHECK(!registry_, "Fp8Operands::add(" << name << "): already allocated");
  names_.push_back(name);
  roles_.push_back(role);
  return size() - 1;
}

void Fp8Operands::allocate(core::Backend& backend, const core::Fp8ScalingConfig& config) {
  registry_ = std::make_unique<core::Fp8ScalingRegistry>(config);
  formats_.clear();
  for (int i = 0; i < size(); ++i) {
    formats_.push_back(roles_[i] == core::Fp8Role::kGradient ? config.grad_format : DType::kE4M3);
    registry_->add(names_[i], formats_[i]);
  }
  const Shape shape{static_cast<int64_t>(size())};
  scale_ = Tensor::empty(shape, DType::kF32, backend.device());
  scale_inv_ = Tensor::empty(shape, DType::kF32, backend.device());
  amax_ = Tensor::empty(shape, DType::kF32, backend.device());
  backend.fill(amax_, 0.0f);
  use_amax_ = Tensor::empty(shape, DType::kF32, backend.device());
  for (int i = 0; i < size(); ++i) {
    scale_views_.push_back(scale_.view(i, Shape{1}));
    scale_inv_views_.push_back(scale_inv_.view(i, Shape{1}));
    amax_views_.push_back(amax_.view(i, Shape{1}));
    use_amax_views_.push_back(use_amax_.view(i, Shape{1}));
  }
  upload_scales(backend);
}

void Fp8Operands::begin_step(core::Backend& backend) {
  backend.fill(amax_, 0.0f);
}

void Fp8Operands::quantize(core::Backend& backend, int slot, const Tensor& src, Tensor& dst) {
  if (registry_->config().recipe == core::Fp8Recipe::kCurrent) {
    // This use's own amax and scale, on the device. A zero or non-finite amax keeps the scale
    // the slot had (the step's, or an earlier micro-batch's in this step).
    backend.amax(src, use_amax_views_[slot]);
    backend.fp8_scale_from_amax(use_amax_views_[slot], core::fp8_max(formats_[slot]),
                                registry_->config().margin, scale_views_[slot],
                                scale_inv_views_[slot]);
  }
  core::CastParams p;
  p.scale = &scale_views_[slot];
  p.amax = &amax_views_[slot];
  p.accumulate_amax = true;
  p.saturation = core::Saturation::kSatFinite;
  backend.cast(src, dst, p);
}

core::Fp8Operand Fp8Operands::quantize_operand(core::Backend& backend, int slot, const Tensor& src,
                                               bool transpose) {
  MANTISSA_CHECK(block_scaled(), "Fp8Operands::quantize_operand("
                                     << names_[slot] << "): recipe "
                                     << core::fp8_recipe_name(config().recipe)
                                     << " scales whole tensors; use quantize()");
  MANTISSA_CHECK(src.shape().rank() == 2, "Fp8Operands::quantize_operand("
                                              << names_[slot] << "): " << src.describe()
                                              << " is not 2-D");
  const core::ScaleMode mode = core::fp8_scale_mode(config().recipe, roles_[slot]);
  const int64_t rows = src.dim(transpose ? 1 : 0);
  const int64_t k = src.dim(transpose ? 0 : 1);
  core::Fp8Operand op;
  op.mode = mode;
  op.codes = Tensor::empty(Shape{rows, k}, formats_[slot], backend.device());
  op.scale = Tensor::empty(Shape{core::scale_count(mode, rows, k)}, core::scale_dtype(mode),
                           backend.device());
  core::BlockQuantizeParams p;
  p.mode = mode;
  p.transpose = transpose;
  p.power_of_two = config().power_of_two;
  p.amax = &amax_views_[slot];
  p.accumulate_amax = true;
  backend.quantize_blocks(src, op.codes, op.scale, p);
  return op;
}

std::vector<float> Fp8Operands::read_amaxes(core::Backend& backend) {
  std::vector<float> amaxes(static_cast<size_t>(size()));
  Tensor host = Tensor::wrap(amaxes.data(), Shape{static_cast<int64_t>(size())}, DType::kF32);
  backend.copy(amax_, host);
  backend.synchronize();
  return amaxes;
}

void Fp8Operands::update_scales(core::Backend& backend, const std::vector<float>& amaxes) {
  registry_->update(amaxes);
  upload_scales(backend);
}

void Fp8Operands::upload_scales(core::Backend& backend) {
  const Shape shape{static_cast<int64_t>(size())};
  std::vector<float> scales, inverses;
  for (int i = 0; i < size(); ++i) {
    scales.push_back(registry_->tensor(i).scale);
    inverses.push_back(registry_->tensor(i).scale_inv);
  }
  backend.copy(Tensor::wrap(scales.data(), shape, DType::kF32), scale_);
  // A copy from host memory has read it on return (Backend::copy), so the host vectors may
  // die with this frame without a host synchronisation.
  backend.copy(Tensor::wrap(inverses.data(), shape, DType::kF32), scale_inv_);
}

}  // namespace mantissa::train
