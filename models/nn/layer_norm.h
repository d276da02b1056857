// LayerNorm over the channel axis with learned gain and bias (FP32 statistics inside the op).
#pragma once

#include <string>

#include "core/tensor/tensor.h"
#include "train/parameters.h"
#include "train/step_context.h"

namespace mantissa::models {

class LayerNorm {
 public:
  LayerNorm(train::ParameterStore& store, const std::string& name, int64_t channels);

  core::Tensor forward(train::StepContext& ctx, const core::Tensor& x);      // [N, C] -> [N, C]
  core::Tensor backward(train::StepContext& ctx, const core::Tensor& dout);  // -> dx [N, C]

 private:
  train::ParameterStore& store_;
  int gamma_, beta_;
  core::Tensor saved_x_, mean_, rstd_;
};

}  // namespace mantissa::models
