// Linear layer y = x W^T + b with W stored [out, in] (the PyTorch / llm.c layout).
//
// Forward and the two backward GEMMs:
//   y  = x W^T        gemm(x[N,in], W[out,in], trans_b)
//   dx = dy W         gemm(dy[N,out], W[out,in])
//   dW += dy^T x      gemm(dy[N,out], x[N,in], trans_a), FP32, beta = 1 into the flat grads
// In FP8 mode (policy.fp8_block_gemms and the layer allows it) x and W are quantized to E4M3
// and dy to E5M2 with per-tensor scales from Fp8Operands; the quantized x and W are what the
// backward reuses, so the layer saves FP8 activations instead of BF16 ones.
#pragma once

#include <string>

#include "core/tensor/tensor.h"
#include "train/parameters.h"
#include "train/step_context.h"

namespace mantissa::models {

class Linear {
 public:
  // `fp8` non-null registers this layer's three FP8 operands there.
  Linear(train::ParameterStore& store, const std::string& name, int64_t in, int64_t out,
         float init_std, train::Fp8Operands* fp8);

  core::Tensor forward(train::StepContext& ctx, const core::Tensor& x);    // [N, in] -> [N, out]
  core::Tensor backward(train::StepContext& ctx, const core::Tensor& dy);  // -> dx [N, in]

 private:
  train::ParameterStore& store_;
  int weight_;
  int bias_;
  int64_t in_, out_;
  // Fp8Operands slots, -1 when the layer never runs in FP8.
  int x_slot_ = -1, w_slot_ = -1, dy_slot_ = -1;
  bool used_fp8_ = false;  // the last forward ran in FP8
  core::Tensor saved_x_;   // compute dtype, or E4M3
  core::Tensor saved_w_;   // E4M3 copy of the weight (FP8 only)
};

}  // namespace mantissa::models
