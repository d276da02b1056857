// One finished optimizer step as every sink sees it: the JSON-lines log and the progress line
// (run_log.h) and the Prometheus metrics (metrics.h) all read this one record, which the
// Trainer fills once per step: the training step's own report plus what only the Trainer
// measures (wall time, communication, the loss averaged over ranks, FP8 scaling state).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "train/training_step.h"

namespace mantissa::metrics {

struct Fp8TensorStat {
  std::string tensor;  // label value, e.g. "h3.attn.qkv.weight"; keep the set small and fixed
  double amax = 0;
  double scale = 0;
};

struct StepRecord {
  // step (0-based index), loss of this rank, skipped (non-finite gradients: no update),
  // grad_norm, loss_scale, lr, tokens this rank processed, the first non-finite parameter.
  train::StepReport report;
  double mean_loss = 0;            // report.loss averaged over all ranks
  std::optional<double> val_loss;  // held-out loss, on the steps that evaluate
  double eval_seconds = 0;         // wall time of that evaluation (not in step_seconds)
  double step_seconds = 0;         // wall time of the step on this rank
  double allreduce_seconds = 0;    // time this rank waited for gradient collectives
  std::int64_t allreduce_bytes = 0;
  // Host synchronisations of the backend during the step (core::Backend::host_syncs()), in
  // the window of step_seconds: on a GPU each one drains the pipeline.
  std::int64_t host_syncs = 0;
  // Epochs of the training data read by the end of the step (train::DataLoader::epochs_read).
  double epoch = 0;
  std::vector<Fp8TensorStat> fp8;

  double tokens_per_s() const { return static_cast<double>(report.tokens) / step_seconds; }
};

}  // namespace mantissa::metrics
