// GPT-2's initialisation, which Llama-style pretraining keeps (and the MLP's weights use):
// weights N(0, 0.02), and the projections that write into the residual stream
// N(0, 0.02 / sqrt(2 n_layer)): each block adds two of them, so the residual's variance does not
// grow with depth.
#pragma once

#include <cmath>
#include <cstdint>

namespace mantissa::models {

inline constexpr float kInitStd = 0.02f;

inline float residual_init_std(int64_t n_layer) {
  return kInitStd / std::sqrt(2.0f * static_cast<float>(n_layer));
}

}  // namespace mantissa::models
