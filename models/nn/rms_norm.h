// RMSNorm over the channel axis with a learned gain and no bias (FP32 statistics inside the
// op): out = x / sqrt(mean(x^2) + eps) * gain.
#pragma once

#include <string>

#include "core/tensor/tensor.h"
#include "train/parameters.h"
#include "train/step_context.h"

namespace mantissa::models {

class RMSNorm {
 public:
  RMSNorm(train::ParameterStore& store, const std::string& name, int64_t channels, float eps);

  core::Tensor forward(train::StepContext& ctx, const core::Tensor& x);      // [N, C] -> [N, C]
  core::Tensor backward(train::StepContext& ctx, const core::Tensor& dout);  // -> dx [N, C]

 private:
  train::ParameterStore& store_;
  int gain_;
  float eps_;
  core::Tensor saved_x_, rstd_;
};

}  // namespace mantissa::models
