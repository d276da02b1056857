// Precision policies: which dtype each part of a training step uses.
//
//   mode         compute copy + activations   block GEMM operands         loss scaling default
//   FP32         F32                          F32                         none
//   BF16         BF16                         BF16                        none
//   FP16         F16                          F16                         dynamic
//   FP8_HYBRID   BF16                         E4M3 forward, E5M2 grads    none
//
// Whatever the mode, the FP32 master weights, optimizer moments and the flat gradient buffer
// stay FP32, and these parts never go below the compute dtype (they are either numerically
// fragile or too small to gain from FP8): token/position embeddings, LayerNorm, the attention
// score/softmax math (FP32 inside the op), the tied LM head and the cross-entropy loss
// (FP32 inside the op). In FP8_HYBRID only the four Linear layers of each transformer block
// (QKV, attention projection, MLP up and down) run their three GEMMs in FP8.
#pragma once

#include <string>

#include "core/tensor/tensor.h"

namespace mantissa::core {

enum class PrecisionMode { kFP32, kBF16, kFP16, kFP8Hybrid };

struct PrecisionPolicy {
  PrecisionMode mode = PrecisionMode::kFP32;
  DType compute_dtype = DType::kF32;  // weights' compute copy and stored activations
  bool fp8_block_gemms = false;

  static PrecisionPolicy from_mode(PrecisionMode mode) {
    switch (mode) {
      case PrecisionMode::kFP32: return {mode, DType::kF32, false};
      case PrecisionMode::kBF16: return {mode, DType::kBF16, false};
      case PrecisionMode::kFP16: return {mode, DType::kF16, false};
      case PrecisionMode::kFP8Hybrid: return {mode, DType::kBF16, true};
    }
    return {};
  }
};

inline const char* precision_mode_name(PrecisionMode mode) {
  switch (mode) {
    case PrecisionMode::kFP32: return "FP32";
    case PrecisionMode::kBF16: return "BF16";
    case PrecisionMode::kFP16: return "FP16";
    case PrecisionMode::kFP8Hybrid: return "FP8_HYBRID";
  }
  return "unknown";
}

}  // namespace mantissa::core
