#include "dist/zero1_optimizer.h"

#include <algorithm>

#include "core/error.h"

namespace mantissa::dist {

using core::Shape;
using core::Tensor;

Zero1Shard::Zero1Shard(core::Backend& backend, train::ParameterStore& params, StepComm& comm)
    : backend_(backend),
      params_(params),
      comm_(comm),
      counts_(train::split_aligned(params.flat_numel(), comm.size())),
      offsets_(chunk_offsets(counts_)) {
  // (A shard that is everything, as on one rank, needs no cut and no second copy.)
  if (params_.keeps_all_masters() && end() - begin() < params_.flat_numel()) {
    params_.keep_masters(backend_, begin(), end());
  }
  MANTISSA_CHECK(params_.masters_begin() == begin() &&
                     params_.masters_begin() + params_.masters().numel() == end(),
                 "DataParallel: rank " << comm_.rank() << " of " << comm_.size()
                                       << " owns the ZeRO-1 shard [" << begin() << ", " << end()
                                       << ") of the masters, but the parameter store keeps ["
                                       << params_.masters_begin() << ", "
                                       << params_.masters_begin() + params_.masters().numel()
                                       << ")");
}

void Zero1Shard::gather_compute_copy() {
  Tensor& compute = params_.compute();
  const size_t me = static_cast<size_t>(comm_.rank());
  Tensor mine = compute.view(offsets_[me], Shape{counts_[me]});
  // No synchronize first: a communicator orders its collective after the backend's queued work
  // (the optimizer's writes to my shard), as every collective of the gradient pipeline relies on.
  comm_.timed_wait(comm_.ctrl().all_gather(mine, compute, counts_), mine.nbytes());
}

void Zero1Shard::refresh_compute_copy() {
  params_.refresh_compute_copy(backend_);
  gather_compute_copy();
}

Zero1AdamW::Zero1AdamW(Zero1Shard& shard, const core::AdamWConfig& config)
    : shard_(shard), begin_(shard.begin()), end_(shard.end()) {
  // The parameter ranges clipped to the shard, relative to its first element.
  std::vector<core::ParamRange> ranges;
  for (const core::ParamRange& r : train::adamw_ranges(shard.params())) {
    const int64_t lo = std::max(r.offset, begin_);
    const int64_t hi = std::min(r.offset + r.numel, end_);
    if (hi > lo) ranges.push_back({lo - begin_, hi - lo, r.weight_decay});
  }
  adamw_ = std::make_unique<core::AdamW>(shard.backend(), std::move(ranges), end_ - begin_, config);
}

void Zero1AdamW::step(train::ParameterStore& params, float lr, float grad_scale) {
  check_store(params);
  const Shape shape{end_ - begin_};
  Tensor grads = params.grads().view(begin_, shape);
  Tensor compute = params.compute().view(begin_, shape);
  adamw_->step(shard_.backend(), params.masters(), grads, &compute, lr, grad_scale);
  shard_.gather_compute_copy();
}

void Zero1AdamW::refresh_compute_copy(train::ParameterStore& params) {
  check_store(params);
  shard_.refresh_compute_copy();
}

void Zero1AdamW::check_store(const train::ParameterStore& params) const {
  MANTISSA_CHECK(params.masters_begin() == begin_ && params.masters().numel() == end_ - begin_,
                 "ZeRO-1 optimizer of the shard ["
                     << begin_ << ", " << end_ << "): the parameter store keeps the masters ["
                     << params.masters_begin() << ", "
                     << params.masters_begin() + params.masters().numel() << ")");
}

}  // namespace mantissa::dist
