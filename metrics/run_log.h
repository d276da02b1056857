// What a run tells the people and programs following it.
//
// StepLog: every rank writes <run.dir>/log/rank<R>.jsonl, one JSON object per optimizer step,
// flushed at once (a process that crashes loses no finished step; tests and scripts read it while
// the run is going) and synced to disk before each checkpoint (a machine that goes down loses no
// step before the checkpoint a run resumes from, which would leave a gap). Keys: step (0-based
// index, as in debug.inject_nonfinite_steps; the progress line counts from 1), loss (this rank's
// mean), mean_loss (over all ranks), val_loss and eval_seconds (the held-out loss and how long it
// took, only on steps that evaluate), loss_scale, overflow, grad_norm (null when skipped), lr,
// tokens (this rank, this step), epoch (the epochs of training data read by the end of the step:
// the windows handed out since the data's first epoch began, at the start or at a resume that
// changed the data, seq_len, seed or sampling, over the windows that hold the data once),
// tokens_per_s (this rank), step_seconds, allreduce_seconds and allreduce_bytes
// (what the step's collectives waited and were handed; an evaluation's are not the step's),
// host_syncs (the backend's host synchronisations in the step), time (Unix seconds), and
// skipped_param (the first parameter, in the model's order, whose gradient was non-finite on any
// rank: the same on every rank) when there is one. Non-finite numbers are written as null. Each
// step appears once: a run that starts at step S (0 when it starts afresh, else the step of the
// checkpoint it resumed from) first moves the lines of steps S and later, which it redoes (those
// after the checkpoint, or a whole earlier attempt), and any earlier line of a step logged twice
// (by versions before this rule), to log/rank<R>.rolled_back.jsonl, appended there in their order,
// so nothing written is lost. The start reads a log once, a line at a time; a log this rule kept is
// shortened in place (a `tail -f` keeps following it); one with an earlier step logged twice, or
// whose last line to keep lacks its newline, is rewritten.
//
// ProgressLine: rank 0's one-line summary (step/total, loss, loss scale, tokens/s, ETA). On a
// terminal the line updates in place every step and is kept every log_every steps; otherwise a
// plain line is printed every log_every steps. Skipped steps always get a kept line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <deque>
#include <string>
#include <vector>

#include "metrics/step_record.h"

namespace mantissa::metrics {

// The step logs' directory in a run directory.
inline constexpr const char* kStepLogDir = "log";

// Seconds since the Unix epoch: the step log's `time`, and when a checkpoint's save began
// (CheckpointState::saved_unix_time, mantissa_last_checkpoint_timestamp_seconds).
double unix_time_now();

// The ranks R >= world_size of the step logs log/rank<R>.jsonl in `run_dir` (an earlier
// attempt's on more ranks), in increasing order. One rank lists the directory and tells the
// others, rather than every rank of a large job reading the same directory of thousands of
// logs from a shared file system. Throws core::Error naming the directory when it cannot be
// listed.
std::vector<int> logged_ranks_beyond(const std::string& run_dir, int world_size);

class StepLog {
 public:
  // Opens <run_dir>/log/rank<rank>.jsonl (creating log/) for a run of `world_size` ranks
  // starting at 0-based step `first_step`, after moving the lines of that step and later to
  // rank<rank>.rolled_back.jsonl (see above), also in the logs of those of `ranks_beyond`
  // (logged_ranks_beyond) that are rank + world_size, rank + 2 world_size, ...: an earlier
  // attempt's on more ranks, which no rank of this run appends to. Throws core::Error naming the
  // file when it cannot.
  StepLog(const std::string& run_dir, int rank, int world_size, int64_t first_step,
          const std::vector<int>& ranks_beyond);
  ~StepLog();
  StepLog(const StepLog&) = delete;
  StepLog& operator=(const StepLog&) = delete;

  void write(const StepRecord& record);
  // Everything written is on disk (fsync); throws core::Error naming the file when it is not.
  void sync();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::FILE* file_ = nullptr;
};

enum class ProgressMode {
  kAuto,   // kLive when the stream is a terminal, else kLines
  kLive,   // \r-updated line (also through mpirun, whose ranks never see a terminal)
  kLines,  // a plain line every log_every steps
};

// What recurs between a run's steps, as the Trainer schedules it: an evaluation after every
// eval_every steps and a checkpoint after every checkpoint_every (0: never), each also after
// the last step.
struct RecurringWork {
  int64_t eval_every = 0;
  int64_t checkpoint_every = 0;
};

class ProgressLine {
 public:
  ProgressLine(ProgressMode mode, int64_t total_steps, int64_t log_every, std::FILE* out,
               RecurringWork recurring = {});

  // After each step (record.report.step is the 0-based index of the step just done): step,
  // loss, scale, lr, the tokens per second of all `world_size` ranks and the ETA, both at the
  // median time of the recent steps (a stall moves neither); after the first step this process
  // runs (its warm-up), that step's time instead.
  void update(const StepRecord& record, int world_size);
  // A checkpoint save between steps and how long it took, for the ETA.
  void add_checkpoint_seconds(double seconds) {
    checkpoint_seconds_ += seconds;
    ++checkpoints_seen_;
  }
  // A line of its own (ends the live line first).
  void note(const std::string& text);
  // Ends a live line, so what follows starts on a fresh line.
  void finish();

 private:
  // What the steps after the `done` ones take, each at `step_seconds`, with the evaluations and
  // checkpoints among them.
  double eta_seconds(double step_seconds, int64_t done) const;

  bool live_ = false;
  int64_t total_steps_;
  int64_t log_every_;
  std::FILE* out_;
  bool line_open_ = false;                  // a live line is on screen without its newline
  std::deque<double> recent_step_seconds_;  // the last steps' times, oldest first (the ETA's)
  RecurringWork recurring_;
  // The evaluations and checkpoints this process has run, and their time in total.
  double eval_seconds_ = 0;
  int64_t evals_seen_ = 0;
  double checkpoint_seconds_ = 0;
  int64_t checkpoints_seen_ = 0;
};

}  // namespace mantissa::metrics
