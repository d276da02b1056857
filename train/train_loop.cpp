#include "train/train_loop.h"

namespace mantissa::train {

std::vector<StepReport> train_loop(LanguageModel& model, core::Backend& backend,
                                   const core::PrecisionPolicy& policy, DataLoader& loader,
                                   const TrainLoopConfig& config, Optimizer& optimizer,
                                   GradientSync* sync,
                                   const std::function<void(TrainingStep&)>& configure_step,
                                   const std::function<void(const StepReport&)>& on_step) {
  core::LrScheduleConfig lr = config.lr;
  if (lr.total_steps == 1) lr.total_steps = config.steps;
  const core::LrSchedule schedule(lr);
  core::LossScaler scaler(config.loss_scale);
  TrainingStep step(model, backend, policy, scaler, optimizer, schedule, config.grad_clip);
  if (configure_step) configure_step(step);

  std::vector<StepReport> reports;
  for (int64_t s = 0; s < config.steps; ++s) {
    std::vector<Batch> micro_batches;
    for (int64_t i = 0; i < config.grad_accum_steps; ++i) micro_batches.push_back(loader.next());
    reports.push_back(step.run(s, micro_batches, sync));
    if (on_step) on_step(reports.back());
  }
  return reports;
}

std::vector<StepReport> train_single_rank(LanguageModel& model, core::Backend& backend,
                                          const core::PrecisionPolicy& policy, DataLoader& loader,
                                          const TrainLoopConfig& config,
                                          const std::function<void(TrainingStep&)>& configure_step,
                                          const std::function<void(const StepReport&)>& on_step) {
  LocalAdamW optimizer(backend, model.parameters(), config.adamw);
  return train_loop(model, backend, policy, loader, config, optimizer, nullptr, configure_step,
                    on_step);
}

}  // namespace mantissa::train
