// The seam where data parallelism plugs into the training step. A single rank runs with no
// GradientSync at all; dist/ implements it over MPI or NCCL.
#pragma once

#include <vector>

#include "core/tensor/tensor.h"

namespace mantissa::models {

class GradientSync {
 public:
  virtual ~GradientSync() = default;

  // The gradient of parameter `param` is final for this step: reductions of buckets that
  // are now complete may start, overlapping the rest of backward.
  virtual void grad_ready(int param) = 0;
  // Waits for every reduction; afterwards `grads` holds the average over ranks. Returns
  // whether this rank saw a non-finite gradient before any reduced-precision cast.
  virtual bool finish(core::Tensor& grads) = 0;
  // Elementwise maximum over ranks, in place (overflow flags, FP8 amaxes).
  virtual void max_across_ranks(std::vector<float>& values) = 0;
};

}  // namespace mantissa::models
