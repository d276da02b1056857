// The single-rank training loop: data, step, repeat. The launcher's Trainer adds gradient
// sync, checkpoints, metrics and signals around the same TrainingStep; tests and benchmarks
// use this loop directly.
#pragma once

#include <functional>
#include <vector>

#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/precision/loss_scaler.h"
#include "models/data/data_loader.h"
#include "models/training/training_step.h"

namespace mantissa::models {

struct TrainLoopConfig {
  int64_t steps = 100;
  int64_t grad_accum_steps = 1;
  float grad_clip = 1.0f;
  core::LrScheduleConfig lr;  // total_steps is taken from `steps` when left at 1
  core::AdamWConfig adamw;
  core::LossScalerConfig loss_scale;
};

// Trains `model` for config.steps optimizer steps on batches from `loader`; `on_step` (if
// set) sees every step's report, and may inject faults through `step` before it runs.
std::vector<StepReport> train_single_rank(
    LanguageModel& model, core::Backend& backend, const core::PrecisionPolicy& policy,
    DataLoader& loader, const TrainLoopConfig& config,
    const std::function<void(TrainingStep&)>& configure_step = {},
    const std::function<void(const StepReport&)>& on_step = {});

}  // namespace mantissa::models
