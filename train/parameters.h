// The parameter store: every trainable tensor of a model lives in three flat buffers —
// FP32 masters, FP32 gradients and the compute copy (the masters rounded to the policy's
// compute dtype) — and each parameter is a view (offset, shape) into all three.
//
// Under ZeRO-1 a rank keeps only one contiguous range of the masters, its shard (allocated
// so from the start, or cut down with keep_masters): the gradients and the compute copy stay
// whole, and the compute copy is then the only complete copy of the weights on the rank
// (dist/ all-gathers it from every rank's range).
//
// Flat buffers make the distributed and persistence machinery simple: gradient buckets,
// ZeRO shards, checkpoints and consistency checksums are all operations on contiguous
// element ranges. Each parameter starts at a multiple of kParameterAlignment elements so
// that its views are 128-byte aligned in every dtype (FP8 GEMMs need 16 bytes); the padding
// is zero in all buffers and never changes.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_set>
#include <vector>

#include "core/ops/backend.h"
#include "core/tensor/tensor.h"

namespace mantissa::train {

inline constexpr int64_t kParameterAlignment = 128;

// n elements split into `parts` contiguous pieces of nearly equal size, each a multiple of
// kParameterAlignment except the last non-empty one (the ones after it are empty): the ZeRO-1
// shards of the flat buffers, and each rank's piece of a gradient bucket.
std::vector<int64_t> split_aligned(int64_t n, int parts);

// Which masters a store keeps: all of them (world 1), or piece `rank` of split_aligned over
// the flat buffers into `world` pieces (a ZeRO-1 rank's shard).
struct MasterShard {
  int rank = 0;
  int world = 1;
};

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
  int64_t offset = 0;   // first element in the flat buffers
  core::Tensor master;  // undefined once the store keeps only a range of the masters
  core::Tensor grad;
  core::Tensor compute;
  int64_t numel() const { return spec.shape.numel(); }
};

class ParameterStore {
 public:
  // Registers a parameter (before allocate) and returns its index.
  int add(ParameterSpec spec);

  // Allocates the flat buffers on the backend's device -- the gradients and the compute copy
  // whole, the masters only for `shard` -- initialises the masters deterministically from
  // `seed` (each element's value depends only on the seed, the parameter's name and its
  // index, not on the order of registration or on the shard), zeroes the gradients and fills
  // the compute copy. The initial values pass through a small buffer, so no full FP32 copy of
  // the weights is ever held besides the masters kept.
  void allocate(core::Backend& backend, core::DType compute_dtype, uint64_t seed,
                MasterShard shard = {});

  // Keeps only the masters [begin, end) and frees the others (ZeRO-1: this rank's shard).
  // Afterwards masters() is that range, element 0 being flat index masters_begin(), and no
  // Parameter::master is defined. Once, on a store that holds all masters.
  void keep_masters(core::Backend& backend, int64_t begin, int64_t end);

  // Sets every weight from `weights` (FP32, flat_numel() elements, on the host or the
  // backend's device, zero in the padding): the masters take their range of it and the
  // compute copy all of it, rounded.
  void set_weights(core::Backend& backend, const core::Tensor& weights);

  // Rounds the masters into their range of the compute copy (after loading a checkpoint, say;
  // the optimizer does it in the same pass as the update otherwise). When the store keeps
  // only a range of the masters, the rest of the compute copy is left as it is.
  void refresh_compute_copy(core::Backend& backend);
  void zero_grad(core::Backend& backend);
  // Sets the elements of parameter `index` from `first` on to zero, in the compute copy and
  // in the masters this store keeps (a vocabulary's padding rows, say).
  void zero_from(core::Backend& backend, int index, int64_t first);

  int size() const { return static_cast<int>(params_.size()); }
  Parameter& operator[](int i) { return params_[static_cast<size_t>(i)]; }
  const Parameter& operator[](int i) const { return params_[static_cast<size_t>(i)]; }
  const std::vector<Parameter>& all() const { return params_; }

  // Elements in the flat buffers, padding included.
  int64_t flat_numel() const { return flat_numel_; }
  // Elements that are parameters (padding excluded).
  int64_t parameter_count() const;
  // The masters this store keeps: all flat_numel() of them, or one range (allocate's shard,
  // or the range keep_masters chose).
  core::Tensor& masters() { return masters_; }
  const core::Tensor& masters() const { return masters_; }
  int64_t masters_begin() const { return masters_begin_; }
  bool keeps_all_masters() const { return masters_.numel() == flat_numel_; }
  // Throws, naming `who` and the range kept, unless the store keeps all masters.
  void require_all_masters(const std::string& who) const;
  core::Tensor& grads() { return grads_; }
  core::Tensor& compute() { return compute_; }

  // The parameter registered as `name`; throws core::Error naming it when there is none.
  const Parameter& named(const std::string& name) const;

  // The parameter whose elements contain flat index `index`, or -1 for padding.
  int find_by_flat_index(int64_t index) const;

 private:
  // Sets flat elements [begin, begin + values.numel()) from `values` (FP32 on the backend's
  // device): the masters kept in that range, and the compute copy, rounded.
  void set_range(core::Backend& backend, const core::Tensor& values, int64_t begin);

  std::vector<Parameter> params_;
  std::unordered_set<std::string> names_;  // of params_, for add's check in O(1)
  int64_t flat_numel_ = 0;
  int64_t masters_begin_ = 0;
  core::Tensor masters_, grads_, compute_;
};

}  // namespace mantissa::train
