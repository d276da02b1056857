// The seam where data parallelism plugs into the training step. A single rank runs with no
// GradientSync at all; dist::DataParallel implements it over MPI or NCCL.
//
// Protocol of one step: grad_ready() for each parameter as backward finalises its gradient
// (reductions overlap the rest of backward), then finish(), then the scalar collectives. Every
// rank makes the same calls in the same order.
#pragma once

#include <vector>

#include "core/tensor/tensor.h"

namespace mantissa::train {

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // The gradient of parameter `param` is final for this step: reductions of buckets that
  // are now complete may start, overlapping the rest of backward.
  virtual void grad_ready(int param) = 0;
  // Waits for every reduction; afterwards `grads` holds the average over ranks on the range
  // this rank's optimizer owns (all of it, or its ZeRO-1 shard), and `check` (an F32 scalar on
  // the backend's device) this rank's check of its gradients before any reduced-precision cast
  // (a saturating FP8 cast would turn an inf into a finite value, and under ZeRO-1 a rank never
  // sees most of the reduced sums). The check stays on the device: the step reads it back with
  // its own scalars, at its one host synchronisation, and asks saw_nonfinite(). Where nothing is
  // reduced or cast (one rank in FP32) it reports nothing: the step's own check of the
  // gradients sees everything there.
  virtual void finish(core::Tensor& grads, core::Tensor& check) = 0;
  // Whether `check`, finish()'s check read back, says this rank saw a non-finite gradient.
  virtual bool saw_nonfinite(float check) const = 0;
  // Elementwise maximum over ranks, in place (overflow flags, FP8 amaxes).
  virtual void max_across_ranks(std::vector<float>& values) = 0;
  // Sum over ranks, bit-identical on every rank (the squared gradient norm of ZeRO-1 shards,
  // the mean loss, tokens).
  virtual double sum_across_ranks(double value) = 0;
};

}  // namespace mantissa::train
