// Loss scaling for reduced-precision backward passes.
//
// The loss is multiplied by scale() before backward so that small gradients stay above the
// FP16 underflow threshold; the optimizer multiplies gradients by inv_scale() to undo it. After
// every step the caller reports whether any gradient was non-finite (the flag already
// MAX-reduced across ranks, so every rank feeds the same sequence and keeps the same state) and
// update() says whether the step must be skipped.
//
// Modes:
//  - kDynamic: the scale adapts, following Megatron-LM's DynamicGradScaler (DeepSpeed's
//    default, consecutive_hysteresis=false, behaves the same):
//      overflow: the step is skipped; growth_tracker = 0;
//                hysteresis_tracker = max(hysteresis_tracker - 1, 0);
//                if hysteresis_tracker is now 0: scale = max(scale * backoff_factor, min).
//      clean:    growth_tracker += 1; when it reaches growth_interval:
//                growth_tracker = 0, hysteresis_tracker = hysteresis,
//                scale = min(scale * growth_factor, max).
//    So `hysteresis` counts overflows since the last growth, not consecutive ones: with the
//    default 2, the first overflow after a growth (or after the start) only skips the step, and
//    every further overflow also halves the scale until the next growth re-arms the tolerance.
//    Clean steps between overflows do not re-arm it.
//  - kStatic: the scale stays at `init`; an overflow still skips the step.
//  - kNone: the scale is 1 (BF16 and FP32 need none); an overflow still skips the step.
//
// Abort: an overflowing step taken at the minimum scale (in kStatic/kNone the fixed scale is the
// minimum) increments overflows_at_min; a clean step resets it. When it reaches
// max_overflows_at_min, update() throws core::Error: the gradients are non-finite even at the
// smallest scale allowed, so skipping further steps would only spin forever.
#pragma once

#include <cstdint>

namespace mantissa::core {

enum class LossScaleMode : uint8_t { kDynamic, kStatic, kNone };

struct LossScalerConfig {
  LossScaleMode mode = LossScaleMode::kDynamic;
  double init = 65536.0;  // 2^16; the fixed scale in kStatic
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // clean steps between two growths
  int32_t hysteresis = 2;          // overflows tolerated after a growth before the first backoff
  double min = 1.0;
  double max = 16777216.0;  // 2^24
  int64_t max_overflows_at_min = 10;

  bool operator==(const LossScalerConfig&) const = default;
};

// Throws core::ConfigError "loss_scale.<field> = <value>: <rule>" for the first value out of its
// range (core/config_check.h). Every field is checked, also those the mode ignores, so that a
// typo does not wait for the day someone switches modes:
//   min > 0; max in [min, FLT_MAX]; init > 0, in [min, max] for kDynamic, else <= FLT_MAX;
//   growth_factor > 1 (finite); backoff_factor in (0, 1); growth_interval, hysteresis and
//   max_overflows_at_min >= 1.
void validate(const LossScalerConfig& config);

// Everything the scaler carries from step to step: a checkpoint stores exactly this, and the
// cross-rank consistency check compares it.
struct LossScalerState {
  float scale = 1.0f;
  int64_t growth_tracker = 0;        // clean steps since the last overflow or growth
  int32_t hysteresis_tracker = 0;    // overflows still tolerated before a backoff (kDynamic only)
  int64_t overflows_at_min = 0;      // consecutive overflowing steps taken at the minimum scale
  int64_t overflow_steps_total = 0;  // steps skipped for non-finite gradients, ever
  bool dynamic = false;              // `scale` is a kDynamic one (not a fixed kStatic/kNone scale)

  bool operator==(const LossScalerState&) const = default;
};

class LossScaler {
 public:
  // Validates the config (validate above).
  explicit LossScaler(const LossScalerConfig& config);

  float scale() const { return state_.scale; }
  // 1/scale computed in double and rounded once, so unscaling matches PyTorch's GradScaler.
  float inv_scale() const;

  // Advances the state machine for a step computed with the current scale; returns true when
  // the step must be skipped (found_nonfinite). Throws core::Error when the scale is stuck at
  // its minimum (see the header comment).
  bool update(bool found_nonfinite);

  const LossScalerConfig& config() const { return config_; }
  const LossScalerState& state() const { return state_; }
  // Restores a checkpointed state; rejects a scale that is not finite and positive, or
  // negative counters. kDynamic carries a dynamic scale on, clamped into [min, max] (a resumed
  // run may change them), and starts afresh from init after a fixed one (a BF16 run resumed in
  // FP16), keeping only overflow_steps_total. kStatic and kNone keep their configured scale
  // and take only the counters.
  void set_state(const LossScalerState& state);

 private:
  float min_scale() const;

  LossScalerConfig config_;
  LossScalerState state_;
};

}  // namespace mantissa::core
