// DataParallel's control communicator, and the communication of one training step as the
// metrics report it (DataParallel::last_step_comm_seconds/bytes).
//
// The control communicator carries the blocking collectives outside the gradient pipeline: the
// scalar ones of a step (max_across_ranks, sum_across_ranks), the start-up broadcast, the
// ZeRO-1 all-gather of the compute copy and the consistency check. Those of host values (the
// scalar ones, the consistency check's words) go through a host communicator instead where one
// is given (MPI beside NCCL): a device communicator would cost two waits for the GPU per
// collective (the copy there and back), several per step. It is used only while no
// collective of the pipeline is in flight (before the first grad_ready of a step, after
// finish()); the pipeline posts on duplicates of it (dist/bucketed_grad_sync.cpp).
//
// Accounting. A step opens at its first grad_ready() or finish() (open_step), which zeroes the
// counts, and finish() closes it. Until the next step opens, the bytes every collective is
// handed and the seconds spent waiting for those that had not finished add up: the gradient
// pipeline's, and those of every blocking collective here, so the scalar collectives after
// finish() and the ZeRO-1 all-gather of the optimizer step count into the step they follow.
// The Trainer reads the counts once the step's own collectives are done: an evaluation's, a
// consistency check's and a save's come after and are no step's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/ops/backend.h"
#include "dist/communicator.h"

namespace mantissa::dist {

class StepComm {
 public:
  // `ctrl`'s device must be the backend's (DataParallel::create checks it); `host_scalars`, when
  // not null, is a host communicator of the same ranks for the scalar collectives.
  StepComm(core::Backend& backend, std::unique_ptr<Communicator> ctrl,
           std::unique_ptr<Communicator> host_scalars);

  Communicator& ctrl() { return *ctrl_; }
  int rank() const { return ctrl_->rank(); }
  int size() const { return ctrl_->size(); }

  // Zeroes the counts, once per step (a no-op while the step is open).
  void open_step();
  void close_step() { step_open_ = false; }
  void add_seconds(double seconds) { seconds_ += seconds; }
  void add_bytes(int64_t bytes) { bytes_ += bytes; }
  double seconds() const { return seconds_; }
  int64_t bytes() const { return bytes_; }

  // Waits for `request`, counting its time and `bytes`.
  void timed_wait(RequestPtr request, size_t bytes);

  // train::GradientSync's scalar collectives.
  // Elementwise maximum over ranks, in place; a NaN anywhere becomes +inf.
  void max_across_ranks(std::vector<float>& values);
  // Sum over ranks in rank order: the same bits on every rank.
  double sum_across_ranks(double value);
  // Every rank's `mine` (each rank the same number of words), rank after rank, on every rank.
  std::vector<int64_t> all_gather_host(std::span<const int64_t> mine);

 private:
  // Where the scalar collectives go: the host communicator, else ctrl_.
  Communicator& scalars() { return host_scalars_ ? *host_scalars_ : *ctrl_; }
  // `host` itself on the host, else a copy of it on `device`; and back.
  core::Tensor copy_to(core::Device device, const core::Tensor& host);
  void copy_back(const core::Tensor& buf, core::Tensor& host);

  core::Backend& backend_;
  std::unique_ptr<Communicator> ctrl_;
  std::unique_ptr<Communicator> host_scalars_;
  bool step_open_ = false;
  double seconds_ = 0.0;
  int64_t bytes_ = 0;
};

}  // namespace mantissa::dist
