#include "core/precision/loss_scaler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "core/config_check.h"
#include "core/error.h"

namespace mantissa::core {

namespace {

bool positive_finite(double x) {
  return std::isfinite(x) && x > 0.0;
}

}  // namespace

void validate(const LossScalerConfig& c) {
  // The scale is kept as a float (what the loss is multiplied by), so its bounds must be floats.
  const double float_max = std::numeric_limits<float>::max();
  positive("loss_scale.min", c.min);
  fits_float("loss_scale.min", c.min);
  require(c.max >= c.min && c.max <= float_max, "loss_scale.max", format_number(c.max),
          "must lie in [min = " + format_number(c.min) + ", " + format_number(float_max) + "]");
  positive("loss_scale.init", c.init);
  fits_float("loss_scale.init", c.init);
  if (c.mode == LossScaleMode::kDynamic) {
    require(c.init >= c.min && c.init <= c.max, "loss_scale.init", format_number(c.init),
            "must lie in [min, max] = [" + format_number(c.min) + ", " + format_number(c.max) +
                "] for a DYNAMIC loss scale");
  }
  require(std::isfinite(c.growth_factor) && c.growth_factor > 1.0, "loss_scale.growth_factor",
          format_number(c.growth_factor), "must be > 1");
  require(c.backoff_factor > 0.0 && c.backoff_factor < 1.0, "loss_scale.backoff_factor",
          format_number(c.backoff_factor), "must lie in (0, 1)");
  at_least("loss_scale.growth_interval", c.growth_interval, 1);
  at_least("loss_scale.hysteresis", c.hysteresis, 1);
  at_least("loss_scale.max_overflows_at_min", c.max_overflows_at_min, 1);
}

LossScaler::LossScaler(const LossScalerConfig& config) : config_(config) {
  validate(config_);
  switch (config_.mode) {
    case LossScaleMode::kDynamic:
      state_.scale = static_cast<float>(config_.init);
      state_.hysteresis_tracker = config_.hysteresis;
      state_.dynamic = true;
      break;
    case LossScaleMode::kStatic: state_.scale = static_cast<float>(config_.init); break;
    case LossScaleMode::kNone: state_.scale = 1.0f; break;
  }
}

float LossScaler::inv_scale() const {
  return static_cast<float>(1.0 / state_.scale);
}

float LossScaler::min_scale() const {
  return config_.mode == LossScaleMode::kDynamic ? static_cast<float>(config_.min) : state_.scale;
}

bool LossScaler::update(bool found_nonfinite) {
  LossScalerState& s = state_;
  const bool dynamic = config_.mode == LossScaleMode::kDynamic;
  if (!found_nonfinite) {
    s.overflows_at_min = 0;
    s.growth_tracker += 1;
    if (dynamic && s.growth_tracker == config_.growth_interval) {
      s.growth_tracker = 0;
      s.hysteresis_tracker = config_.hysteresis;
      s.scale = static_cast<float>(std::min(s.scale * config_.growth_factor, config_.max));
    }
    return false;
  }

  s.overflow_steps_total += 1;
  s.growth_tracker = 0;
  s.overflows_at_min = s.scale <= min_scale() ? s.overflows_at_min + 1 : 0;
  if (s.overflows_at_min >= config_.max_overflows_at_min) {
    std::ostringstream message;
    if (!dynamic && s.scale > 1.0f) {
      // A fixed scale above 1 may be what overflows: the setting, not the training, is at fault.
      message << "the static loss scale " << s.scale << " overflowed " << s.overflows_at_min
              << " consecutive steps — lower precision.loss_scale.init (or use DYNAMIC)";
    } else {
      // At scale 1 nothing is being scaled, so the gradients themselves overflow.
      const char* cause = s.scale == 1.0f ? "even unscaled" : "even at this scale";
      message << "loss scale stuck at minimum " << s.scale << " after " << s.overflows_at_min
              << " consecutive overflowing steps; gradients are non-finite " << cause
              << " — lower the learning rate or check the data";
    }
    throw DivergedError(message.str());
  }
  if (dynamic) {
    s.hysteresis_tracker = std::max(s.hysteresis_tracker - 1, 0);
    if (s.hysteresis_tracker == 0) {
      s.scale = static_cast<float>(std::max(s.scale * config_.backoff_factor, config_.min));
    }
  }
  return true;
}

void LossScaler::set_state(const LossScalerState& state) {
  MANTISSA_CHECK(positive_finite(state.scale),
                 "loss scaler state: scale must be finite and > 0, got " << state.scale);
  MANTISSA_CHECK(state.growth_tracker >= 0 && state.hysteresis_tracker >= 0 &&
                     state.overflows_at_min >= 0 && state.overflow_steps_total >= 0,
                 "loss scaler state: negative counter (growth_tracker "
                     << state.growth_tracker << ", hysteresis_tracker " << state.hysteresis_tracker
                     << ", overflows_at_min " << state.overflows_at_min << ", overflow_steps_total "
                     << state.overflow_steps_total << ")");
  if (config_.mode == LossScaleMode::kDynamic && !state.dynamic) {
    // A fixed scale says nothing about the gradients' range: start as a fresh run does.
    const int64_t overflow_steps_total = state.overflow_steps_total;
    state_ = LossScaler(config_).state();
    state_.overflow_steps_total = overflow_steps_total;
    return;
  }
  // kDynamic carries the scale on, inside this run's [min, max]; kStatic and kNone keep the
  // scale the config says (a run may switch modes when it resumes, e.g. FP16 to BF16). The
  // counters carry over, inside this run's intervals: clean steps past a shorter
  // growth_interval grow the scale at the next clean step (update() grows it when the count
  // reaches the interval, which a count already past it never would again).
  const float scale = config_.mode == LossScaleMode::kDynamic
                          ? std::clamp(state.scale, static_cast<float>(config_.min),
                                       static_cast<float>(config_.max))
                          : state_.scale;
  state_ = state;
  state_.scale = scale;
  state_.dynamic = config_.mode == LossScaleMode::kDynamic;
  state_.growth_tracker = std::min(state_.growth_tracker, config_.growth_interval - 1);
  state_.hysteresis_tracker = std::min(state_.hysteresis_tracker, config_.hysteresis);
}

}  // namespace mantissa::core
