// ZeRO-1 (Megatron's distributed optimizer): each rank keeps and updates one shard of the FP32
// masters and of the AdamW moments, and the compute copy, the only whole copy of the weights,
// is all-gathered from every rank's shard after each update.
//
// The shards are contiguous, aligned, nearly equal ranges of the flat buffers, shard r on rank
// r (train::split_aligned, which train::MasterShard allocates a store with, so that all masters
// are never held at once). Masters and moments then take 12 bytes per parameter / N on each
// rank; the gradients and the compute copy stay whole (the gradient sync reduce-scatters each
// rank's shard of the averaged gradients to it, dist/bucketed_grad_sync.h).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/ops/backend.h"
#include "core/optim/adamw.h"
#include "dist/step_comm.h"
#include "train/optimizer.h"
#include "train/parameters.h"

namespace mantissa::dist {

// This rank's shard of the parameter store, and the all-gather that makes the compute copy
// whole from every rank's shard (on the control communicator, counted into the step).
class Zero1Shard {
 public:
  // Cuts a store that keeps all masters down to this rank's shard (ParameterStore::
  // keep_masters; the rest is freed). A store that keeps a range already (allocated with a
  // train::MasterShard) must keep exactly this rank's shard. `params` must outlive the object.
  Zero1Shard(core::Backend& backend, train::ParameterStore& params, StepComm& comm);

  int64_t begin() const { return offsets_[static_cast<size_t>(comm_.rank())]; }
  int64_t end() const { return offsets_[static_cast<size_t>(comm_.rank()) + 1]; }
  // Every rank's shard boundaries: shard r is [offsets[r], offsets[r + 1]).
  const std::vector<int64_t>& offsets() const { return offsets_; }
  core::Backend& backend() { return backend_; }
  train::ParameterStore& params() { return params_; }

  // In place: every rank's shard of the compute copy to every rank. Collective.
  void gather_compute_copy();
  // Every rank rounds its shard of the masters into the compute copy, then the shards are
  // all-gathered. Collective.
  void refresh_compute_copy();

 private:
  core::Backend& backend_;
  train::ParameterStore& params_;
  StepComm& comm_;
  std::vector<int64_t> counts_, offsets_;
};

// AdamW over this rank's shard of the masters (the only masters the parameter store keeps),
// with moments only for the shard; step() and refresh_compute_copy() end with the all-gather of
// the compute copy, so both are collective.
class Zero1AdamW final : public train::Optimizer {
 public:
  // `shard` must outlive the optimizer.
  Zero1AdamW(Zero1Shard& shard, const core::AdamWConfig& config);

  void step(train::ParameterStore& params, float lr, float grad_scale) override;
  void refresh_compute_copy(train::ParameterStore& params) override;
  int64_t owned_begin() const override { return begin_; }
  int64_t owned_end() const override { return end_; }
  core::Tensor& first_moment() override { return adamw_->first_moment(); }
  core::Tensor& second_moment() override { return adamw_->second_moment(); }
  int64_t steps_taken() const override { return adamw_->steps_taken(); }
  void set_steps_taken(int64_t steps) override { adamw_->set_steps_taken(steps); }

 private:
  void check_store(const train::ParameterStore& params) const;

  Zero1Shard& shard_;
  int64_t begin_, end_;
  std::unique_ptr<core::AdamW> adamw_;
};

}  // namespace mantissa::dist
