// One optimizer step of mixed-precision training on one rank:
//
//   1. forward/backward over each micro-batch with the loss multiplied by the loss scale,
//      gradients accumulating into the flat FP32 buffer (gradient sync, when present, is told
//      as each parameter's gradient becomes final on the last micro-batch);
//   2. gradient sync finishes (grads averaged over ranks, at least on the range the optimizer
//      owns: all of it, or this rank's ZeRO-1 shard);
//   3. unscale fused with the non-finite check on the owned range, together with the flag
//      gradient sync raised before its casts; the flag is MAX-reduced over ranks, so every
//      rank takes the same decision;
//   4. overflow: the step is skipped (masters, moments and the optimizer's step count stay
//      bit-identical) and the loss scaler backs off; otherwise the gradients are clipped by
//      their global norm and the optimizer updates the masters and the compute copy;
//   5. FP8 amaxes are MAX-reduced and the next scales computed.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/optim/lr_schedule.h"
#include "core/precision/loss_scaler.h"
#include "core/precision/policy.h"
#include "train/data/data_loader.h"
#include "train/gradient_sync.h"
#include "train/language_model.h"
#include "train/optimizer.h"

namespace mantissa::train {

struct StepReport {
  int64_t step = 0;      // 0-based index of this optimizer step
  double loss = 0.0;     // mean over this rank's tokens
  bool skipped = false;  // non-finite gradients somewhere: no update
  // The global norm of the unscaled gradients (before clipping); 0 when skipped.
  double grad_norm = 0.0;
  float loss_scale = 1.0f;  // the scale this step ran with
  double lr = 0.0;
  int64_t tokens = 0;  // tokens this rank processed
  // When skipped: the first parameter, in the model's order, with a non-finite gradient on
  // any rank (the same name on every rank); empty when only a rank's gradient sync saw it.
  std::string nonfinite_param;
};

// The loss scaler gave up at this step (core::LossScaler::update's DivergedError, thrown on
// every rank alike): the step's report comes with it, so that the step is logged.
class StepDiverged : public core::DivergedError {
 public:
  StepDiverged(const std::string& message, StepReport report)
      : core::DivergedError(message), report_(std::move(report)) {}
  const StepReport& report() const { return report_; }

 private:
  StepReport report_;
};

class TrainingStep {
 public:
  TrainingStep(LanguageModel& model, core::Backend& backend, const core::PrecisionPolicy& policy,
               core::LossScaler& scaler, Optimizer& optimizer, const core::LrSchedule& schedule,
               float grad_clip);

  // Runs step `step` over this rank's micro-batches (gradient accumulation when several).
  // `sync` is required when the optimizer owns only a shard of the parameters.
  StepReport run(int64_t step, const std::vector<Batch>& micro_batches, GradientSync* sync);

  // Fault-injection hook (see fault_injection.h): called with the averaged, still scaled
  // gradients of the owned range (element 0 is flat index optimizer.owned_begin()) just before
  // the non-finite check.
  std::function<void(core::Tensor& grads, int64_t step)> before_check;

 private:
  LanguageModel& model_;
  core::Backend& backend_;
  core::PrecisionPolicy policy_;
  core::LossScaler& scaler_;
  Optimizer& optimizer_;
  const core::LrSchedule& schedule_;
  float grad_clip_;
};

}  // namespace mantissa::train
