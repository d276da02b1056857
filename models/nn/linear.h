// Linear layer y = x W^T + b with W stored [out, in] (the PyTorch / llm.c layout), or
// y = x W^T for a layer without bias (Llama's).
//
// Forward and the two backward GEMMs:
//   y  = x W^T        gemm(x[N,in], W[out,in], trans_b)
//   dx = dy W         gemm(dy[N,out], W[out,in])
//   dW += dy^T x      gemm(dy[N,out], x[N,in], trans_a), FP32, beta = 1 into the flat grads
// In FP8 mode (policy.fp8_block_gemms and the layer allows it) the operands are quantized by
// Fp8Operands' recipe:
//  - DELAYED, CURRENT: x and W to E4M3 and dy to the gradient format (E5M2 by default) with
//    per-tensor scales; the quantized x and W are what the backward reuses, so the layer
//    saves FP8 activations instead of BF16 ones.
//  - BLOCKWISE, ROWWISE, MXFP8: every GEMM takes both operands K-major with scales along K
//    (the TN layout cuBLASLt's FP8 kernels want, so no transposed copies are made):
//      y  = gemm(x8[N,in], W8[out,in], trans_b)          K = in
//      dx = gemm(dy8[N,out], Wt8[in,out], trans_b)       K = out
//      dW += gemm(dyt8[out,N], xt8[in,N], trans_b)       K = N, the tokens
//    Inputs and gradients get the recipe's input/gradient scales (BLOCKWISE: 1x128 tiles
//    along K), weights its weight scales (BLOCKWISE: 128x128 blocks). For the weight gradient
//    x and dy are regrouped along the tokens, quantized from high precision as DeepSeek-V3
//    does: xt8 in the forward (and saved instead of x), dyt8 in the backward. Wt8, W's
//    transposed copy, is quantized with its own blocks, which for 128x128 blocks are the
//    transposes of W8's (same codes and scales, transposed). W8 and Wt8 are made once per
//    training step (StepContext::step) and kept, as Transformer Engine keeps its weight
//    copies, so gradient accumulation does not quantize the weights again per micro-batch.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor/tensor.h"
#include "train/fp8_operands.h"
#include "train/parameters.h"
#include "train/step_context.h"

namespace mantissa::models {

class Linear {
 public:
  // `fp8` non-null registers this layer's three FP8 operands there. With `with_bias` the
  // layer has a bias parameter "<name>.bias".
  Linear(train::ParameterStore& store, const std::string& name, int64_t in, int64_t out,
         float init_std, train::Fp8Operands* fp8, bool with_bias = true);

  core::Tensor forward(train::StepContext& ctx, const core::Tensor& x);    // [N, in] -> [N, out]
  core::Tensor backward(train::StepContext& ctx, const core::Tensor& dy);  // -> dx [N, in]

 private:
  // The block recipes' passes (see the top).
  core::Tensor forward_blocks(train::StepContext& ctx, const core::Tensor& x);
  core::Tensor backward_blocks(train::StepContext& ctx, const core::Tensor& dy);
  // W8 (transposed = false) or Wt8 for this step, quantized on first use in the step.
  const core::Fp8Operand& weight_operand(train::StepContext& ctx, bool transposed);

  train::ParameterStore& store_;
  int weight_;
  int bias_;  // -1 without bias
  int64_t in_, out_;
  // Fp8Operands slots, -1 when the layer never runs in FP8.
  int x_slot_ = -1, w_slot_ = -1, dy_slot_ = -1;
  bool used_fp8_ = false;      // the last forward ran in FP8
  core::Tensor saved_x_;       // compute dtype, or E4M3 (per-tensor recipes)
  core::Tensor saved_w_;       // E4M3 copy of the weight (per-tensor recipes)
  core::Fp8Operand saved_xt_;  // x^T regrouped along the tokens (block recipes)
  // The block recipes' weight copies and the step they were made in (-1: none kept).
  core::Fp8Operand weight8_[2];
  int64_t weight8_step_[2] = {-1, -1};
};

}  // namespace mantissa::models
