// Learning-rate schedule: linear warmup, then cosine decay to a floor (llm.c's schedule).
//
// `step` is 0-based: the index of the optimizer update about to be applied (0 for the first).
// With peak lr, W = warmup_steps, N = total_steps and lr_min = min_lr_ratio * lr:
//   step >= N:      lr_min
//   step < W:       lr * (step + 1) / W        (the first update already moves: lr / W, not 0)
//   W <= step < N:  lr_min + 0.5 * (1 + cos(pi * (step - W) / (N - W))) * (lr - lr_min)
// so the peak is reached at step W - 1 and held at step W, and the decay ends at step N, one past
// the last update of an N-step run. A warm-up longer than the run (a short trial of a config
// written for a longer one) ramps for the whole run and never reaches the peak. Whether skipped
// (overflowing) steps advance `step` is the trainer's choice.
#pragma once

#include <cstdint>

namespace mantissa::core {

struct LrScheduleConfig {
  double lr = 6e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  double min_lr_ratio = 0.0;

  bool operator==(const LrScheduleConfig&) const = default;
};

// Throws core::ConfigError "lr_schedule.<field> = <value>: <rule>" for the first value out of its
// range (core/config_check.h): total_steps >= 1, lr >= 0 (finite), warmup_steps >= 0,
// min_lr_ratio in [0, 1].
void validate(const LrScheduleConfig& config);

class LrSchedule {
 public:
  // Validates the config (validate above).
  explicit LrSchedule(const LrScheduleConfig& config);

  double at(int64_t step) const;

 private:
  LrScheduleConfig config_;
};

}  // namespace mantissa::core
