#include "models/nn/parameters.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace mantissa::models {
namespace {

uint64_t fnv1a(const std::string& text) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : text) h = (h ^ c) * 0x100000001b3ULL;
  return h;
}

// Standard normal from two counter-based uniforms (Box-Muller), so element i of a parameter
// gets the same value however the parameters are laid out.
float normal_sample(uint64_t stream, int64_t i) {
  const auto index = static_cast<uint64_t>(i);
  const double u1 = (core::random_u32(stream, 2 * index) + 1.0) / 4294967297.0;  // (0, 1)
  const double u2 = core::random_u32(stream, 2 * index + 1) / 4294967296.0;      // [0, 1)
  return static_cast<float>(std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2));
}

}  // namespace

int ParameterStore::add(ParameterSpec spec) {
  MANTISSA_CHECK(!masters_.defined(),
                 "ParameterStore::add(" << spec.name << "): parameters are already allocated");
  for (const Parameter& p : params_) {
    MANTISSA_CHECK(p.spec.name != spec.name,
                   "ParameterStore::add: duplicate parameter name " << spec.name);
  }
  Parameter p;
  p.offset = flat_numel_;
  p.spec = std::move(spec);
  const int64_t n = p.numel();
  flat_numel_ += (n + kParameterAlignment - 1) / kParameterAlignment * kParameterAlignment;
  params_.push_back(std::move(p));
  return size() - 1;
}

void ParameterStore::allocate(core::Backend& backend, core::DType compute_dtype, uint64_t seed) {
  MANTISSA_CHECK(!masters_.defined(), "ParameterStore::allocate: called twice");
  const core::Device device = backend.device();
  const core::Shape flat{flat_numel_};

  core::Tensor host = core::Tensor::empty(flat, core::DType::kF32);
  float* values = host.data_as<float>();
  std::fill(values, values + flat_numel_, 0.0f);
  for (const Parameter& p : params_) {
    float* dst = values + p.offset;
    switch (p.spec.init) {
      case Init::kZeros: break;
      case Init::kOnes: std::fill(dst, dst + p.numel(), 1.0f); break;
      case Init::kNormal: {
        const uint64_t stream = core::mix64(seed) ^ fnv1a(p.spec.name);
        for (int64_t i = 0; i < p.numel(); ++i) dst[i] = p.spec.init_std * normal_sample(stream, i);
        break;
      }
    }
  }

  masters_ = core::Tensor::empty(flat, core::DType::kF32, device);
  grads_ = core::Tensor::empty(flat, core::DType::kF32, device);
  compute_ = core::Tensor::empty(flat, compute_dtype, device);
  for (Parameter& p : params_) {
    p.master = masters_.view(p.offset, p.spec.shape);
    p.grad = grads_.view(p.offset, p.spec.shape);
    p.compute = compute_.view(p.offset, p.spec.shape);
  }
  zero_grad(backend);
  set_weights(backend, host);
}

void ParameterStore::keep_masters(core::Backend& backend, int64_t begin, int64_t end) {
  MANTISSA_CHECK(keeps_all_masters(),
                 "ParameterStore::keep_masters: already keeps only the masters ["
                     << masters_begin_ << ", " << masters_begin_ + masters_.numel() << ")");
  MANTISSA_CHECK(0 <= begin && begin <= end && end <= flat_numel_,
                 "ParameterStore::keep_masters: [" << begin << ", " << end
                                                   << ") is not a range of the " << flat_numel_
                                                   << " flat elements");
  core::Tensor kept =
      core::Tensor::empty(core::Shape{end - begin}, core::DType::kF32, backend.device());
  backend.copy(masters_.view(begin, kept.shape()), kept);
  backend.synchronize();  // the copy is done before the full buffer is freed
  for (Parameter& p : params_) p.master = core::Tensor();
  masters_ = std::move(kept);
  masters_begin_ = begin;
}

void ParameterStore::require_all_masters(const std::string& who) const {
  MANTISSA_CHECK(keeps_all_masters(), who << ": the parameter store keeps only the masters ["
                                          << masters_begin_ << ", "
                                          << masters_begin_ + masters_.numel() << ") of "
                                          << flat_numel_ << " (one ZeRO-1 shard)");
}

void ParameterStore::set_weights(core::Backend& backend, const core::Tensor& weights) {
  MANTISSA_CHECK(weights.dtype() == core::DType::kF32 && weights.numel() == flat_numel_,
                 "ParameterStore::set_weights: expects f32[" << flat_numel_ << "], got "
                                                             << weights.describe());
  core::Tensor on_device = weights;
  if (!(weights.device() == backend.device())) {
    on_device = core::Tensor::empty(weights.shape(), weights.dtype(), backend.device());
    backend.copy(weights, on_device);
  }
  backend.copy(on_device.view(masters_begin_, masters_.shape()), masters_);
  backend.cast(on_device, compute_, core::CastParams{});
  backend.synchronize();  // `weights` and the staging copy may go away after the return
}

void ParameterStore::refresh_compute_copy(core::Backend& backend) {
  core::Tensor range = compute_.view(masters_begin_, masters_.shape());
  backend.cast(masters_, range, core::CastParams{});
}

void ParameterStore::zero_grad(core::Backend& backend) {
  backend.fill(grads_, 0.0f);
}

int64_t ParameterStore::parameter_count() const {
  int64_t n = 0;
  for (const Parameter& p : params_) n += p.numel();
  return n;
}

int ParameterStore::find_by_flat_index(int64_t index) const {
  for (int i = 0; i < size(); ++i) {
    const Parameter& p = params_[static_cast<size_t>(i)];
    if (index >= p.offset && index < p.offset + p.numel()) return i;
  }
  return -1;
}

}  // namespace mantissa::models
