#include "core/optim/lr_schedule.h"

#include <cmath>
#include <numbers>

#include "core/config_check.h"
#include "core/error.h"

namespace mantissa::core {

void validate(const LrScheduleConfig& config) {
  at_least("lr_schedule.total_steps", config.total_steps, 1);
  non_negative("lr_schedule.lr", config.lr);
  fits_float("lr_schedule.lr", config.lr);
  at_least("lr_schedule.warmup_steps", config.warmup_steps, 0);
  in_unit_range("lr_schedule.min_lr_ratio", config.min_lr_ratio, false);
}

LrSchedule::LrSchedule(const LrScheduleConfig& config) : config_(config) {
  validate(config_);
}

double LrSchedule::at(int64_t step) const {
  MANTISSA_CHECK(step >= 0, "lr schedule: step must be >= 0, got " << step);
  const LrScheduleConfig& c = config_;
  const double lr_min = c.min_lr_ratio * c.lr;
  if (step >= c.total_steps) return lr_min;
  if (step < c.warmup_steps) {
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  }
  const double progress = static_cast<double>(step - c.warmup_steps) /
                          static_cast<double>(c.total_steps - c.warmup_steps);
  return lr_min + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (c.lr - lr_min);
}

}  // namespace mantissa::core
