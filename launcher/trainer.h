// The Trainer: one rank's part of a training run, wired from a validated TrainConfig.
//
// Construction builds, in this order (every rank runs the same code, see dist/data_parallel.h):
// run.dir and its lock (rank 0), the device and backend, the metrics exporter (first, so that
// a slow start is scraped rather than seen down), the corpus and this rank's data loader, the
// checks that every rank shares the build, settings, kind of device and tokens, has a GPU of
// its own and sees rank 0's run.dir (launcher/rank_agreement.h), the model (same seed on every
// rank), data parallelism (gradient sync + the optimizer, ZeRO-1 sharded or not), the loss
// scaler, LR schedule and training step (with fault injection from debug.*) and the
// checkpointer; then it resumes from <run.dir>/checkpoints when there is a checkpoint
// (checkpoint.resume), or broadcasts rank 0's initial weights (random, or imported from
// model.init_from).
//
// run() trains to run.steps. After every step each rank logs its JSON line, rank 0 updates the
// progress line, and all ranks agree, with one MAX all-reduce, on whether any of them received
// SIGUSR1/SIGTERM/SIGINT or could not write its step log (AgreedStop). Checkpoints are written
// every checkpoint.every_steps, at the end, and at an agreed stop. The divergence guard stops
// the run on a non-finite mean loss or validation loss, or when the loss scaler gives up
// (non-finite gradients at its minimum scale max_overflows_at_min times in a row). These
// conditions are identical on every rank (the losses are summed over ranks, the overflow flag
// is MAX-reduced), so all ranks stop at the same step and exit alike.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"
#include "config.pb.h"
#include "core/ops/backend.h"
#include "core/optim/lr_schedule.h"
#include "core/precision/loss_scaler.h"
#include "core/precision/policy.h"
#include "dist/data_parallel.h"
#include "dist/world.h"
#include "launcher/device.h"
#include "launcher/rank_agreement.h"
#include "launcher/run_dir_cleanup.h"
#include "launcher/run_dir_lock.h"
#include "metrics/metrics.h"
#include "metrics/run_log.h"
#include "train/data/data_loader.h"
#include "train/evaluate.h"
#include "train/language_model.h"
#include "train/optimizer.h"
#include "train/training_step.h"

namespace mantissa::launcher {

// A stop that a signal requests, in increasing urgency: kStop (SIGUSR1, SIGTERM, SIGHUP)
// checkpoints and exits 0, kInterrupt (SIGINT) checkpoints and exits as interrupted.
enum class StopRequest : uint8_t { kNone = 0, kStop = 1, kInterrupt = 2 };

// What the ranks agree on between steps: the most urgent signal's request on any rank, and
// whether any rank's step log could not be written (the run then stops with a checkpoint and
// exits 1; an evaluation, which a signal's stop cuts short, still runs).
struct AgreedStop {
  StopRequest signal = StopRequest::kNone;
  bool log_unwritable = false;

  bool stops() const { return signal != StopRequest::kNone || log_unwritable; }
  AgreedStop merged(const AgreedStop& later) const {
    return {std::max(signal, later.signal), log_unwritable || later.log_unwritable};
  }
};

class Trainer {
 public:
  // `config` must have its defaults applied and be validated. Throws core::ConfigError for what
  // the config asks and this world or device cannot do (exit code 2), core::Error for other
  // failures.
  Trainer(dist::World& world, const TrainConfig& config, metrics::ProgressMode progress);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains from the current step to run.steps; returns the exit code (exit_codes.h).
  int run();

 private:
  // The training corpus and this rank's loader, and the validation set when the run evaluates.
  void build_data();
  // The seq_len a resume must keep: its newest checkpoint's, for a GPT-2 or an MLP (a Llama's
  // may change); none for a start that resumes nothing or where no manifest says.
  std::optional<int64_t> seq_len_a_resume_keeps() const;
  // An evaluation's held-out loss; none when it was not due or was abandoned.
  struct Evaluation {
    std::optional<double> loss;
    bool abandoned = false;  // the same on every rank
  };
  // The held-out loss after step `steps_done`, when it is due (every run.eval_every steps, and
  // after the last step); collective. A signal's stop comes first, after the last step too,
  // so that the checkpoint is written within a preemption's grace period: a signal's stop already
  // agreed
  // (`signal`) skips the evaluation, and the ranks agree on a stop after each micro-batch, so a
  // signal that reaches any rank while it runs ends it on every rank at the same micro-batch. Rank
  // 0 says how far a long evaluation has come.
  Evaluation maybe_evaluate(int64_t steps_done, StopRequest signal);
  // The exporter (and pusher) of this rank's metrics; returns the start line that names the
  // peak MFU is measured against.
  std::string build_metrics();
  // precision.fp8.recipe's scale modes on this device (exit 2 where it lacks them).
  void check_fp8_recipe_support() const;
  // Resumes from the newest intact checkpoint; false when there is none (or resume is NEVER).
  bool restore();
  // The loss scaler's and FP8 scaling's state from the checkpoint, as far as this run's
  // settings take them (a fixed scale, another FP8 recipe: said, and started afresh).
  void restore_scaling(const checkpoint::CheckpointState& state);
  // Rank 0's, once the run's tokenizer is read: data.tokenizer another than the tokenizer.model
  // beside the shards is a core::ConfigError, unless data.allow_tokenizer_change, which warns.
  void require_shards_own_tokenizer();
  // A checkpoint trained with another tokenizer (its CRC32C against rank 0's, which every rank
  // holds), or with one where this run finds none: RanksDisagree, unless
  // data.allow_tokenizer_change, which warns.
  void require_same_tokenizer(const checkpoint::CheckpointState& state);
  // What differs from the run the checkpoint was saved by, said before the steps go on: the
  // data, the seed, settings, the global batch.
  void report_changes(const checkpoint::CheckpointState& state);
  // model.init_from: the weights a run starts from (when it does not resume): an llm.c GPT-2
  // file or a Hugging Face model directory (launcher/hf_weights.h).
  void import_initial_weights();
  // Called after step `steps_done` completed: writes a checkpoint when it is due (every
  // checkpoint.every_steps, and after the last step) or when `force`d by a stop request;
  // whether it wrote one.
  bool maybe_checkpoint(int64_t steps_done, bool force);
  // What every rank agrees on: the most urgent signal's request of all ranks (SIGINT's
  // interrupt, whose exit code wins over a stop's), and whether any rank's step log failed
  // (whose exit code, 1, wins over both). Collective.
  AgreedStop agreed_stop();
  void save_checkpoint(int64_t steps_done);
  // The buffers a checkpoint holds, as this rank keeps them: the masters of the parameter
  // store and the moments of the range the optimizer owns (whole without ZeRO, the shard
  // under ZeRO-1), each with the flat index of its element 0.
  struct StateBuffer {
    const char* name;
    core::Tensor tensor;
    int64_t begin;
  };
  std::vector<StateBuffer> state_buffers();
  // This rank's part of state_buffers() in a checkpoint, as views in the same order: its
  // ZeRO-1 shard, or without ZeRO its 1/N of the replica every rank holds (see replica_part in
  // trainer.cpp).
  std::vector<checkpoint::BufferSlice> checkpoint_slices();
  dist::ReplicaState replica_state(int64_t steps_done) const;
  RankStart rank_start() const;  // what this rank brings to require_ranks_agree
  // Rank 0 only, through the progress line; the build's name (version, commit) before the first.
  void say(const std::string& line);
  // This rank's step log failed (`why`): said on this rank; no more is written to it, and
  // agreed_stop tells every rank to stop with a checkpoint.
  void step_log_failed(const std::string& why);

  dist::World& world_;
  TrainConfig config_;
  std::string run_dir_;
  // Rank 0's: the lock, released after the log and checkpoints (members go in reverse order)
  // and after the cleanup of a run.dir that a failed start created, which removes the lock file
  // while the lock is still held (another start that locked it once released would hold a
  // lock on a removed file).
  std::optional<RunDirLock> run_dir_lock_;
  RunDirCleanup run_dir_cleanup_;
  DeviceInfo device_;
  int cpus_in_use_ = 1;  // set_cpu_threads's: the CPUs this rank's threads run on at once
  std::unique_ptr<core::Backend> backend_;
  core::PrecisionPolicy policy_;
  std::unique_ptr<train::LanguageModel> model_;
  std::unique_ptr<train::DataLoader> loader_;
  CorpusIdentity train_data_;       // the training corpus's
  CorpusIdentity validation_data_;  // the validation corpus's, when the run evaluates
  // What this run's validation loss is measured on (CheckpointState::validation_key); a run
  // without evaluations carries its checkpoint's.
  uint64_t validation_key_ = 0;
  std::string tokenizer_file_;     // rank 0's: run_tokenizer_file, empty without one
  uint32_t tokenizer_crc32c_ = 0;  // CRC32C of rank 0's tokenizer_file_ (on every rank); 0: none
  std::unique_ptr<train::Evaluator> evaluator_;  // null when run.eval_every is 0
  std::unique_ptr<dist::DataParallel> dp_;
  std::unique_ptr<train::Optimizer> optimizer_;
  std::unique_ptr<core::LossScaler> scaler_;
  std::unique_ptr<core::LrSchedule> schedule_;
  std::unique_ptr<train::TrainingStep> step_;
  std::unique_ptr<checkpoint::Checkpointer> checkpointer_;
  std::unique_ptr<metrics::Metrics> metrics_;
  std::unique_ptr<metrics::StepLog> log_;
  std::string log_failure_;  // why this rank's step log could not be written; empty: it can
  metrics::ProgressLine progress_;
  bool banner_said_ = false;  // whether say() has printed the build's name

  int64_t start_step_ = 0;    // the step the loop starts at (after a resume: the saved one)
  int64_t tokens_total_ = 0;  // tokens trained on, all ranks together
  int64_t last_saved_step_ = -1;
  double resumed_saved_unix_time_ = 0;  // of the checkpoint resumed from (0: none, or unknown)
};

}  // namespace mantissa::launcher
