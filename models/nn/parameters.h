// The parameter store: every trainable tensor of a model lives in three flat buffers —
// FP32 masters, FP32 gradients and the compute copy (the masters rounded to the policy's
// compute dtype) — and each parameter is a view (offset, shape) into all three.
//
// Flat buffers make the distributed and persistence machinery simple: gradient buckets,
// ZeRO shards, checkpoints and consistency checksums are all operations on contiguous
// element ranges. Each parameter starts at a multiple of kParameterAlignment elements so
// that its views are 128-byte aligned in every dtype (FP8 GEMMs need 16 bytes); the padding
// is zero in all buffers and never changes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/tensor/tensor.h"

namespace mantissa::models {

inline constexpr int64_t kParameterAlignment = 128;

enum class Init { kZeros, kOnes, kNormal };

struct ParameterSpec {
  std::string name;
  core::Shape shape;
  Init init = Init::kZeros;
  float init_std = 0.0f;      // for kNormal
  bool weight_decay = false;  // GPT-2 decays matrices only, not biases or norms
};

struct Parameter {
  ParameterSpec spec;
  int64_t offset = 0;  // first element in the flat buffers
  core::Tensor master;
  core::Tensor grad;
  core::Tensor compute;
  int64_t numel() const { return spec.shape.numel(); }
};

class ParameterStore {
 public:
  // Registers a parameter (before allocate) and returns its index.
  int add(ParameterSpec spec);

  // Allocates the three flat buffers on the backend's device, initialises the masters
  // deterministically from `seed` (each element's value depends only on the seed, the
  // parameter's name and its index, not on the order of registration), zeroes the gradients
  // and fills the compute copy.
  void allocate(core::Backend& backend, core::DType compute_dtype, uint64_t seed);

  // Rounds the masters into the compute copy (after loading a checkpoint, say; the optimizer
  // does it in the same pass as the update otherwise).
  void refresh_compute_copy(core::Backend& backend);
  void zero_grad(core::Backend& backend);

  int size() const { return static_cast<int>(params_.size()); }
  Parameter& operator[](int i) { return params_[static_cast<size_t>(i)]; }
  const Parameter& operator[](int i) const { return params_[static_cast<size_t>(i)]; }
  const std::vector<Parameter>& all() const { return params_; }

  // Elements in the flat buffers, padding included.
  int64_t flat_numel() const { return flat_numel_; }
  // Elements that are parameters (padding excluded).
  int64_t parameter_count() const;
  core::Tensor& masters() { return masters_; }
  core::Tensor& grads() { return grads_; }
  core::Tensor& compute() { return compute_; }

  // The parameter whose elements contain flat index `index`, or -1 for padding.
  int find_by_flat_index(int64_t index) const;

 private:
  std::vector<Parameter> params_;
  int64_t flat_numel_ = 0;
  core::Tensor masters_, grads_, compute_;
};

}  // namespace mantissa::models
