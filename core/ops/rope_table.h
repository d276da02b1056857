// The angle table of rotary position embeddings (Backend::rope_forward, rope_backward), built
// once per run on the host, the same for both backends, and copied to the backend's device.
#pragma once

#include <cstdint>

#include "core/ops/backend.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

// table[positions, head_dim] (F32, on backend's device): for position p and i < head_dim / 2,
// channel i holds cos(a) and channel head_dim / 2 + i holds sin(a), with
//   a = p * inv_freq_i,  inv_freq_i = 1 / theta^(2i / head_dim),
// computed in FP32 steps as Hugging Face's Llama computes them (so that positions far out rotate
// by the same angles as theirs): the exponent 2i / head_dim, the power (correctly rounded here;
// PyTorch's may be one ulp off at times), its reciprocal and the product p * inv_freq_i are each
// rounded to FP32. cos and sin of that angle are evaluated in FP64 and rounded once. head_dim
// must be even and positive, positions positive, theta finite and greater than 1 (Llama uses
// 10000 or 500000).
Tensor make_rope_table(Backend& backend, int64_t positions, int64_t head_dim, double theta);

}  // namespace mantissa::core
