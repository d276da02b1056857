// Prometheus metrics of one training rank.
//
// Every rank owns one Metrics object. It serves the metrics read-only over HTTP on
// `bind_address:port` (pull; the launcher passes metrics.port + local rank so ranks sharing a
// node do not collide) and, where compute nodes cannot be scraped, pushes them to a
// Pushgateway every `push_every` steps (and at the start, after a step or an evaluation's
// micro-batch 30 s past the last push, at the start and end of a checkpoint save or load, a
// resume) and once more at exit. The names below are a contract with the dashboards and alert
// rules under deploy/ (see deploy/README.md); every series carries a `rank` label.
//
//   mantissa_loss_scale                      gauge      loss scale of the last step
//   mantissa_loss_scale_min                  gauge      the scaler's floor (only when dynamic)
//   mantissa_overflow_steps_total            counter    steps skipped for non-finite gradients
//   mantissa_steps_total                     counter    optimizer steps taken (skipped included)
//   mantissa_tokens_total                    counter    tokens this rank trained on
//   mantissa_loss                            gauge      loss of the last step
//   mantissa_grad_norm                       gauge      gradient norm of the last step not skipped
//   mantissa_learning_rate                   gauge      learning rate of the last step
//   mantissa_data_epoch                      gauge      epochs of training data read
//   mantissa_mfu_ratio                       gauge      model FLOPs utilisation (1: the peak)
//   mantissa_peak_flops                      gauge      the peak FLOP/s MFU is measured against
//   mantissa_step_seconds                    histogram  wall time of a step
//   mantissa_allreduce_seconds               histogram  time a step waited on collectives
//   mantissa_allreduce_bytes_total           counter    bytes this rank handed to collectives
//   mantissa_fp8_amax{tensor}                gauge      the tensor's amax at the last step
//   mantissa_fp8_scale{tensor}               gauge      the tensor's FP8 scale
//   mantissa_val_loss                        gauge      held-out loss at the last evaluation
//   mantissa_val_loss_rises                  gauge      evaluations in a row whose loss rose
//   mantissa_last_checkpoint_step            gauge      step of the newest checkpoint written
//   mantissa_last_checkpoint_timestamp_seconds gauge    Unix time its save began
//   mantissa_checkpoint_seconds              histogram  time to write a checkpoint
//   mantissa_run_finished                    gauge      1 once the run ended by itself, else 0
//   mantissa_progress_timestamp_seconds      gauge      Unix time of this process's last
//                                                       progress: its start, a step's end, a
//                                                       micro-batch of an evaluation, a
//                                                       checkpoint save's or load's start and
//                                                       end, a resume
//   mantissa_checkpoint_in_progress          gauge      1 while a checkpoint is written or read
//   mantissa_step                            gauge      steps done, those before a resume too
//   mantissa_run_steps                       gauge      run.steps
//   mantissa_build_info{<build labels>}      gauge      always 1 (only with build labels)
//
// Counters start at zero in every process (also after a resume); Prometheus' rate() and
// increase() treat that as a counter reset. The last step's gauges (loss scale, loss, gradient
// norm, learning rate, data epoch, MFU) appear with the first step, mantissa_step once the run
// knows the step it begins at (after a resume's load), the checkpoint gauges with the first
// checkpoint, the validation gauges with the first evaluation (or a resumed checkpoint's), the
// FP8 gauges with the first step that reports the tensor; MFU and the peak only where both the
// peak and the FLOPs per token (set_model_flops) are known; the loss scale's floor only under a
// dynamic loss scale. The all-reduce time is what the step waited: where backward hides the
// gradient all-reduce, bytes over that time are no link bandwidth. Under DELAYED the FP8 scale
// follows the amax history's maximum, not the last amax: amax x scale / fp8_max is the part of the
// format's range the step used.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "metrics/step_record.h"

namespace mantissa::metrics {

struct MetricsOptions {
  // Pull exporter: listens on bind_address:port. port 0 turns the exporter off (the proto3
  // default of metrics.port), so a run without metrics opens no socket.
  std::string bind_address = "127.0.0.1";
  int port = 0;
  int rank = 0;
  // Exported as mantissa_build_info{rank, <these labels>} 1 (the launcher's are version and
  // revision, the commit, as Prometheus' own prometheus_build_info names them): a dashboard
  // joins on it to show which build each rank runs. Empty: not exported.
  std::map<std::string, std::string> build_labels;
  // Pushgateway grouping key is {job, rank}; empty url turns pushing off. url is
  // "http://host:port" (port defaults to 9091). push_every <= 0 pushes only at exit.
  std::string job = "mantissa";
  std::string pushgateway_url;
  int push_every = 0;
  // MFU = tokens/s × flops_per_token (set_model_flops) / peak_flops, per rank (one device per
  // rank); the peak is exported too (mantissa_peak_flops), to read the ratio by. 0 in either
  // leaves both unexported.
  double peak_flops = 0;
  // The loss scaler's floor; exported as mantissa_loss_scale_min so the "loss scale
  // collapsed" alert can compare against it. 0 when the scale is not dynamic.
  double loss_scale_min = 0;
  // run.steps, exported as mantissa_run_steps beside mantissa_step (the steps the run has
  // done, those before a resume included): "step N of M" on a dashboard.
  std::int64_t run_steps = 0;
};

// The validation loss's trend, which checkpoints carry so that mantissa_val_loss_rises goes on
// counting across a requeue: MantissaValidationLossRising waits for 3 rises in a row, which a
// job requeued before its third evaluation would otherwise never reach.
struct ValLossTrend {
  double last_val_loss = 0;  // the newest evaluation's loss
  int rises = 0;             // evaluations in a row, up to it, whose loss rose
};

class Metrics {
 public:
  // Starts the exporter (throws core::Error naming the address when it cannot listen) and the
  // push thread when a Pushgateway is configured.
  explicit Metrics(MetricsOptions options);
  // Pushes one last time (see finish()).
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // The model's FLOPs per token, for MFU: known once the model is built, which is late in a
  // start (data, the ranks' agreement, the model), while the exporter opens early so that a
  // long start is scraped rather than seen down.
  void set_model_flops(double flops_per_token);

  // The run has started for good (the job owns its run directory): pushed at once, so that a
  // Pushgateway holds this attempt's values (mantissa_run_finished 0, the progress time of its
  // start) instead of an earlier attempt's, and a start that hangs from here is seen stalled.
  void record_started();
  // Training begins after `steps_done` steps (0, or the resumed checkpoint's): mantissa_step
  // appears, so that a resume's long start does not read as a run at step 0.
  void record_first_step(std::int64_t steps_done);
  void record_step(const StepRecord& record);
  // A micro-batch of an evaluation is done: progress (pushed when the last push is 30 s old),
  // so that an evaluation longer than the stall alert's wait is not taken for a hang.
  void record_evaluating();
  // A checkpoint save or load begins: progress, and mantissa_checkpoint_in_progress 1 until
  // record_checkpoint or record_checkpoint_loaded.
  void record_checkpoint_start();
  // The load record_checkpoint_start began has ended, with a checkpoint or without one.
  void record_checkpoint_loaded();
  // A checkpoint of `step` saved in `seconds` from `saved_unix_time` (when its save began, as
  // the checkpoint records it).
  void record_checkpoint(std::int64_t step, double seconds, double saved_unix_time);
  // A resumed run's newest checkpoint until it saves one: the step it holds, and the Unix time
  // its save began (0: unknown, left unexported).
  void record_resumed_checkpoint(std::int64_t step, double saved_unix_time);
  // The trend up to the newest evaluation; none before the first (nor resumed).
  std::optional<ValLossTrend> val_loss_trend() const;
  // A resumed run's trend, as its checkpoint holds it: mantissa_val_loss and
  // mantissa_val_loss_rises show it until the next evaluation, which counts on from it.
  void record_resumed_val_loss(const ValLossTrend& trend);
  // The run ended by itself (all steps done, or stopped by a signal, with a checkpoint or before
  // its first step; not after a failure, such as a step log that could not be written):
  // mantissa_run_finished 1, so that the alerts take a finished job's last values, which a
  // Pushgateway keeps, for no stall.
  void record_finished();
  // Deletes the Pushgateway groups {job, rank} of `ranks`, those an earlier attempt of the job
  // ran on more ranks than this one (the gateway would keep their last values for ever, and
  // MantissaTrainingStalled fire for them); on the push thread, a failure said on stderr.
  // Nothing without a Pushgateway.
  void forget_ranks(const std::vector<int>& ranks);

  // Final push to the Pushgateway (waits for it, 10 s at most, then warns and leaves it to the
  // process's exit) and stops the push thread; idempotent, and the end of this object's use.
  // A run that recorded nothing (it failed early in its start, before record_started: maybe
  // a second job on a run directory in use) pushes nothing: its zeros would replace what the
  // job's earlier attempt, or the job that holds the run directory, left in the Pushgateway.
  // Call it before exiting the process by a path that skips destructors.
  void finish();

  // The port the exporter listens on (0 when it is off).
  int listening_port() const;

 private:
  struct State;
  State& state() const;  // checked: finish() may have left it to a push that did not end
  std::unique_ptr<State> state_;
};

}  // namespace mantissa::metrics
