// AdamW over FP32 master weights held in one flat buffer.
//
// The parameters are described as ranges of the flat buffer (core::ParamRange), each with its
// own weight-decay flag (GPT-2 decays matrices, not biases or norms); one backend call updates
// them all. Moments m and v are FP32 flat buffers shaped like the masters; the compute copy is
// rewritten in the same pass as the update.
// Under ZeRO-1 the same class runs over one rank's shard: ranges are then clipped to it.
#pragma once

#include <cstdint>
#include <vector>

#include "core/ops/backend.h"

namespace mantissa::core {

struct AdamWConfig {
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;

  bool operator==(const AdamWConfig&) const = default;
};

// Throws core::ConfigError "adamw.<field> = <value>: <rule>" for the first value out of its range
// (core/config_check.h): beta1 and beta2 in [0, 1) (the bias correction 1 - beta^t must not
// vanish), eps > 0 (it keeps the update finite where the second moment is 0), weight_decay >= 0,
// all finite.
void validate(const AdamWConfig& config);

class AdamW {
 public:
  // Validates the config (validate above). The ranges lie inside the flat buffer in increasing
  // order of offset, without overlapping (Backend::adamw checks them at each step).
  AdamW(Backend& backend, std::vector<ParamRange> ranges, int64_t flat_numel,
        const AdamWConfig& config);

  // One update: masters -= lr * (adam direction + weight_decay * masters), with the
  // gradients multiplied by grad_scale first (gradient clipping). compute may be null.
  void step(Backend& backend, Tensor& masters, const Tensor& grads, Tensor* compute, float lr,
            float grad_scale);

  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }
  Tensor& first_moment() { return m_; }
  Tensor& second_moment() { return v_; }
  const AdamWConfig& config() const { return config_; }

 private:
  std::vector<ParamRange> ranges_;
  AdamWConfig config_;
  Tensor m_, v_;
  int64_t steps_ = 0;
};

}  // namespace mantissa::core
