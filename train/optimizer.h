// The optimizer as the training step sees it: an update of the FP32 masters this rank owns
// from the averaged gradients, which also leaves the compute copy of EVERY parameter current.
//
// Without sharding a rank owns the whole flat buffer (LocalAdamW below). Under ZeRO-1
// (dist::DataParallel::make_optimizer) a rank owns one contiguous shard [begin, end) of the
// flat buffers: the parameter store keeps only the masters there (ParameterStore::
// keep_masters), the moments are shard-sized, and the compute copy of the other shards
// arrives by an all-gather inside step() and refresh_compute_copy().
//
// Checkpoints read and restore exactly the owned range: params.masters() (which starts at
// flat index owned_begin()) and the moments (first_moment().numel() == owned_end() -
// owned_begin()).
#pragma once

#include <cstdint>

#include "core/ops/backend.h"
#include "core/optim/adamw.h"
#include "train/parameters.h"

namespace mantissa::train {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update: gradients multiplied by grad_scale (unscale and clip folded together), then
  // AdamW on the owned masters with learning rate lr, then the compute copy refreshed.
  // `params.grads()` must hold the averaged gradients at least over the owned range.
  virtual void step(ParameterStore& params, float lr, float grad_scale) = 0;

  // Rounds the owned masters into the compute copy and makes the compute copy whole again
  // (under ZeRO-1 by an all-gather; collective there): after the masters were restored.
  virtual void refresh_compute_copy(ParameterStore& params) = 0;

  // The range of the flat buffers this rank updates: [0, flat_numel) without sharding.
  virtual int64_t owned_begin() const = 0;
  virtual int64_t owned_end() const = 0;

  // FP32 moments of the owned range (shape [owned_end - owned_begin]), on the backend's device.
  virtual core::Tensor& first_moment() = 0;
  virtual core::Tensor& second_moment() = 0;

  // Updates applied so far (AdamW's bias correction); a checkpoint stores it.
  virtual int64_t steps_taken() const = 0;
  virtual void set_steps_taken(int64_t steps) = 0;

  // Bytes of optimizer state this rank holds (the two moments): what ZeRO-1 divides by the
  // ranks.
  int64_t state_bytes() {
    return static_cast<int64_t>(first_moment().nbytes() + second_moment().nbytes());
  }
};

// AdamW over the whole flat buffer, on one rank (or replicated on every rank: ZeRO-0); the
// parameter store must keep all masters.
class LocalAdamW final : public Optimizer {
 public:
  LocalAdamW(core::Backend& backend, const ParameterStore& params, const core::AdamWConfig& config);

  void step(ParameterStore& params, float lr, float grad_scale) override;
  void refresh_compute_copy(ParameterStore& params) override {
    params.refresh_compute_copy(backend_);
  }
  int64_t owned_begin() const override { return 0; }
  int64_t owned_end() const override { return flat_numel_; }
  core::Tensor& first_moment() override { return adamw_.first_moment(); }
  core::Tensor& second_moment() override { return adamw_.second_moment(); }
  int64_t steps_taken() const override { return adamw_.steps_taken(); }
  void set_steps_taken(int64_t steps) override { adamw_.set_steps_taken(steps); }

 private:
  core::Backend& backend_;
  int64_t flat_numel_;
  core::AdamW adamw_;
};

// The AdamW parameter ranges of a model: every parameter, decayed when its spec says so.
std::vector<core::ParamRange> adamw_ranges(const ParameterStore& params);

}  // namespace mantissa::train
