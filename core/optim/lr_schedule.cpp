#include "core/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/error.h"

namespace mantissa::core {

LrSchedule::LrSchedule(const LrScheduleConfig& config) : config_(config) {
  MANTISSA_CHECK(std::isfinite(config.lr) && config.lr >= 0.0,
                 "lr schedule: peak lr must be finite and >= 0, got " << config.lr);
  MANTISSA_CHECK(config.total_steps >= 1,
                 "lr schedule: total steps must be >= 1, got " << config.total_steps);
  MANTISSA_CHECK(config.warmup_steps >= 0 && config.warmup_steps <= config.total_steps,
                 "optimizer.warmup_steps must lie in [0, total steps = "
                     << config.total_steps << "], got " << config.warmup_steps);
  MANTISSA_CHECK(config.min_lr_ratio >= 0.0 && config.min_lr_ratio <= 1.0,
                 "lr schedule: min_lr_ratio must lie in [0, 1], got " << config.min_lr_ratio);
}

double LrSchedule::at(int64_t step) const {
  MANTISSA_CHECK(step >= 0, "lr schedule: step must be >= 0, got " << step);
  const LrScheduleConfig& c = config_;
  const double lr_min = c.min_lr_ratio * c.lr;
  if (step < c.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  }
  if (step >= c.total_steps) return lr_min;
  const double progress = static_cast<double>(step - c.warmup_steps) /
                          static_cast<double>(c.total_steps - c.warmup_steps);
  return lr_min + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (c.lr - lr_min);
}

}  // namespace mantissa::core
