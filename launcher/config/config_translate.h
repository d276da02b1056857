// The config translated into the options of the modules that run it. Each module checks its own
// options (core::validate, dist::validate); config validation runs those checks on these
// translations, so a value is checked by one rule wherever it is caught.
#pragma once

#include <cstdint>
#include <string>

#include "config.pb.h"
#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/precision/fp8_scaling.h"
#include "core/precision/loss_scaler.h"
#include "core/precision/policy.h"
#include "dist/dist_config.h"

namespace mantissa::launcher {

// The model section's sequence length and vocabulary, whichever architecture it holds, and
// the path of that architecture's section for messages ("model.gpt2", "model.llama" or
// "model.mlp").
struct ModelShape {
  std::string prefix;
  int64_t seq_len = 0;
  int64_t vocab_size = 0;
};
ModelShape model_shape(const TrainConfig::Model& model);

core::PrecisionPolicy precision_policy(const TrainConfig& config);
core::LossScalerConfig loss_scaler_config(const TrainConfig& config);  // precision.loss_scale
core::Fp8ScalingConfig fp8_scaling_config(const TrainConfig& config);  // precision.fp8
core::AdamWConfig adamw_config(const TrainConfig& config);             // optimizer.adamw
// optimizer.adamw.lr, optimizer.warmup_steps, optimizer.min_lr_ratio and run.steps.
core::LrScheduleConfig lr_schedule_config(const TrainConfig& config);
dist::DistConfig dist_config(const TrainConfig& config);  // dist

}  // namespace mantissa::launcher
