// The training loop without the Trainer's extras: data, step, repeat. The launcher's Trainer
// adds checkpoints, metrics and signals around the same TrainingStep; tests and benchmarks
// use these loops directly.
#pragma once

#include <functional>
#include <vector>

#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/precision/loss_scaler.h"
#include "train/data/data_loader.h"
#include "train/gradient_sync.h"
#include "train/optimizer.h"
#include "train/training_step.h"

namespace mantissa::train {

struct TrainLoopConfig {
  int64_t steps = 100;
  int64_t grad_accum_steps = 1;
  float grad_clip = 1.0f;
  core::LrScheduleConfig lr;  // total_steps is taken from `steps` when left at 1
  core::AdamWConfig adamw;    // used by train_single_rank (train_loop takes an optimizer)
  core::LossScalerConfig loss_scale;
};

// Trains `model` for config.steps optimizer steps on batches from `loader` with `optimizer`
// and, when not null, gradient sync across ranks; `configure_step` (if set) sees the
// TrainingStep before the first step (fault injection), `on_step` every step's report.
std::vector<StepReport> train_loop(LanguageModel& model, core::Backend& backend,
                                   const core::PrecisionPolicy& policy, DataLoader& loader,
                                   const TrainLoopConfig& config, Optimizer& optimizer,
                                   GradientSync* sync,
                                   const std::function<void(TrainingStep&)>& configure_step = {},
                                   const std::function<void(const StepReport&)>& on_step = {});

// train_loop on one rank with AdamW (config.adamw) over the whole model.
std::vector<StepReport> train_single_rank(
    LanguageModel& model, core::Backend& backend, const core::PrecisionPolicy& policy,
    DataLoader& loader, const TrainLoopConfig& config,
    const std::function<void(TrainingStep&)>& configure_step = {},
    const std::function<void(const StepReport&)>& on_step = {});

}  // namespace mantissa::train
