// Validation of Backend::quantize_blocks, shared by both backends so that a bad call fails
// with the same words everywhere (naming "quantize_blocks", the operand and the shapes).
#pragma once

#include <cstdint>

#include "core/ops/backend.h"

namespace mantissa::core {

// The operand the codes hold: `outer` rows of K elements.
struct QuantizeDims {
  int64_t outer = 0;
  int64_t k = 0;
};

// src 2-D F32, BF16 or F16; codes E4M3 or E5M2 of shape [outer, K]; scales 1-D of
// scale_count(mode, outer, K) elements of scale_dtype(mode); mode not kTensor; amax an F32
// scalar or null; no output overlapping another operand.
QuantizeDims check_quantize_blocks(const Tensor& src, const Tensor& codes, const Tensor& scales,
                                   const BlockQuantizeParams& p, Device device);

}  // namespace mantissa::core
