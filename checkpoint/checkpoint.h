// Checkpoints: save and resume everything a run needs to continue bit for bit.
//
// Layout on disk (format in proto/checkpoint.proto):
//   <dir>/step_<8-digit step>/manifest.pb        TrainState: counters, scaler, FP8, cursor,
//                                                config, parameter layout, tensor index
//   <dir>/step_<8-digit step>/rank_<5-digit>.bin payload written by that rank
//   <dir>/latest                                 "step_<8-digit step>\n", the newest save
//
// `latest` is for people and scripts; a load does not trust it alone but scans the step_*
// directories and takes the newest one that verifies (after a crash between publishing a
// directory and updating `latest`, that is the newer directory).
//
// What is saved: a CheckpointState (small scalars) plus named flat buffers — FP32 masters,
// AdamW moments — of which each rank passes the slice it holds, as a global element range.
// Under ZeRO-1 every rank passes its shard (rank r writes masters[shard r], adam_m[shard r],
// adam_v[shard r]); under ZeRO-0, where every rank holds the same replica, each passes an even
// 1/N of every buffer, so the ranks share the writing.
// The manifest records which element range of which buffer lives where, so a load can ask
// for any range: a run resumed on another number of ranks simply asks for its new shards.
//
// Atomicity. A save writes `step_<N>.tmp/`: every rank writes and fsyncs its payload and its
// part of the index; after a barrier rank 0 merges the index into manifest.pb (fsynced), fsyncs
// the directory, renames it to `step_<N>` (fsyncing <dir>), then replaces `latest` the same
// way (temporary file, fsync, rename; a failure there is a warning, the checkpoint being
// published) and deletes the checkpoints beyond `keep`. A crash at any point leaves either the
// old set of complete checkpoints or the new one.
//
// Integrity. Every tensor entry carries a CRC32C, the manifest carries one over its own bytes,
// and payload files must have exactly the size the index says. A load tries the newest
// checkpoint first; one that is damaged (unreadable, truncated, a CRC mismatch, an index that
// contradicts itself, a manifest of another step than its directory's name) is reported on stderr
// by file and problem, and the next older one is tried. Nothing from a damaged checkpoint reaches
// the caller: the returned state and every element of the requested slices come from one checkpoint
// that verified completely (each rank verifies the CRC of every entry it reads and the size of
// every payload file). A checkpoint that is intact but does not fit the run (another model, other
// buffer sizes) is an error (core::Error), not a reason to fall back: older ones would not fit
// either.
//
// Ranks. The class never talks to MPI: it takes the rank, the world size and one collective
// callback, sum(double) -> double, that blocks until every rank has called it and returns the
// sum of what the ranks passed (the Trainer passes DataParallel::sum_across_ranks). Saves and
// loads are collective: every rank calls them, also the ranks that hold no slice. A failure on
// any rank (disk full, a CRC mismatch in the part one rank reads) is therefore seen by all of
// them and handled the same way everywhere. The checkpoint directory must be one shared file
// system for all ranks: a load first checks that every rank lists the same checkpoints, and
// stops every rank with an error when they do not (a stale directory cache on one node), since
// ranks loading different steps would mix them into one run.
//
// How the Trainer uses it (ZeRO-1 shown, where the parameter store keeps only the shard's
// masters; ZeRO-0: each rank saves and loads views of its 1/N of the whole buffers, and the
// Trainer all-gathers the loaded parts):
//
//   Checkpointer ckpt({.dir = run_dir + "/checkpoints", .keep = cfg.checkpoint().keep()},
//                     {.rank = world.rank(), .world_size = world.size(),
//                      .sum = [&](double v) { return dp->sum_across_ranks(v); }},
//                     backend);
//   N = params.flat_numel(); [b, e) = this rank's shard
//   std::vector<BufferSlice> slices = {
//       {kMastersBuffer, N, b, params.masters()},   // b == params.masters_begin()
//       {"adam_m", N, b, adamw.first_moment()},
//       {"adam_v", N, b, adamw.second_moment()}};
//   // save, every `every_steps` and at a preemption stop:
//   ckpt.save(state, slices);   // state: see CheckpointState
//   // resume, at start-up, into the same slices (this run's shards, whatever the world size
//   // at save time):
//   if (auto state = ckpt.load_latest(parameter_layout(params), slices)) { ... restore }
//
// Both calls take tensors on any device (a device tensor is staged through host memory with
// Backend::copy) and throw core::Error, naming the file and the problem, when they fail;
// load_latest throws core::ConfigError when the newest intact checkpoint does not fit this run
// (another model, or buffers another setup saved).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops/backend.h"
#include "core/precision/fp8_scaling.h"
#include "core/precision/loss_scaler.h"
#include "core/tensor/tensor.h"
#include "train/data/data_loader.h"
#include "train/parameters.h"

namespace mantissa {
class ShardIndex;  // proto/checkpoint.proto
}

namespace mantissa::checkpoint {

inline constexpr uint32_t kCheckpointFormatVersion = 1;

// One parameter's place in the flat buffers (a train::ParameterStore's layout).
struct ParameterLayout {
  std::string name;
  core::Shape shape;
  int64_t offset = 0;

  bool operator==(const ParameterLayout&) const = default;
};

std::vector<ParameterLayout> parameter_layout(const train::ParameterStore& params);

// Without ZeRO every rank holds the same replica of masters and moments, and checkpoints split
// it evenly: rank r of N saves, and at a resume reads, elements [n r / N, n (r + 1) / N) of
// each buffer (Megatron's fully parallel save and load), so the ranks share the file system's
// bandwidth instead of each moving all of it.
struct ReplicaPart {
  int64_t begin;
  int64_t count;
};
ReplicaPart replica_part(int64_t n, int rank, int size);

// The buffer of the parameters' FP32 masters, laid out as parameter_layout says; the others a
// run saves are the optimizer's (the Trainer's).
inline constexpr const char* kMastersBuffer = "masters";

// Everything but the tensors.
struct CheckpointState {
  int64_t step = 0;             // optimizer steps completed: the resumed run runs this step next
  int64_t tokens = 0;           // tokens trained on so far, all ranks together
  int64_t optimizer_steps = 0;  // core::AdamW::steps_taken()
  uint64_t seed = 0;            // run.seed: every random stream is counter-based from it
  int zero_stage = 0;
  int world_size = 1;  // ranks at save time; filled in by save()
  core::LossScalerState loss_scaler;
  core::Fp8ScalingState fp8;  // empty without FP8
  train::DataCursor data;
  uint64_t data_fingerprint = 0;  // train::Corpus::fingerprint() of the training data; 0: unknown
  uint32_t tokenizer_crc32c = 0;  // CRC32C of the run's tokenizer model file; 0: none or unknown
  std::string config_text;        // the effective TrainConfig, protobuf text format
  std::string written_by;         // the build that saved it, "mantissa 0.2.0 (commit ...)"
  double saved_unix_time = 0;     // when its save began; 0: unknown (an older checkpoint)
  // The newest evaluation's validation loss (none before the first) and the evaluations in a
  // row whose loss rose up to it: metrics::ValLossTrend.
  std::optional<double> last_val_loss;
  int val_loss_rises = 0;
  uint64_t validation_key = 0;  // what last_val_loss was measured on (checkpoint.proto); 0: unknown
  // Layout of kMastersBuffer; save() stores it and load_latest() compares it.
  std::vector<ParameterLayout> parameters;

  bool operator==(const CheckpointState&) const = default;
};

// The slice [begin, begin + data.numel()) of the flat buffer `name` of global_numel
// elements. save() reads `data`; load_latest() overwrites it.
struct BufferSlice {
  std::string name;
  int64_t global_numel = 0;
  int64_t begin = 0;
  core::Tensor data;  // contiguous, any dtype, on the host or the backend's device
};

// All of `params`' masters as one slice, to load the weights alone (export, sample).
BufferSlice whole_masters(train::ParameterStore& params);

// Why `dir`, where Checkpointer found no checkpoint, holds none, to follow "<dir> " in a
// message: "does not exist", "is empty", "holds only an unfinished save (step_00000002.tmp),
// which a run killed while saving leaves", or "holds no step_<8 digits> directory".
std::string no_checkpoint_reason(const std::string& dir);

// The steps of the step_<N> directories in `dir` (a run's checkpoints), newest first, complete
// or not yet verified; temporary directories (step_<N>.tmp) and anything else are ignored.
// Empty when `dir` does not exist; throws CheckpointUnreadable when it cannot be listed.
std::vector<int64_t> list_checkpoints(const std::string& dir);

// An intact checkpoint whose parameter layout is not the model's (another model config). It
// carries the config the checkpoint recorded (empty on the ranks that only learnt of it from
// another), so that the caller can name the settings that differ.
class CheckpointMisfit : public core::ConfigError {
 public:
  CheckpointMisfit(const std::string& message, std::string config_text)
      : core::ConfigError(message), config_text_(std::move(config_text)) {}
  const std::string& config_text() const { return config_text_; }

 private:
  std::string config_text_;
};

struct CheckpointOptions {
  std::string dir;  // holds the step_* directories and `latest`
  int keep = 3;     // intact checkpoints kept after a save; 0 keeps all
  // Payload pieces are at most this long, so a load stages at most this much host memory per
  // device tensor, and a CRC mismatch points at a small range.
  int64_t max_entry_bytes = int64_t{64} << 20;
};

struct CheckpointGroup {
  int rank = 0;
  int world_size = 1;
  // Collective sum over ranks (see the file comment), exact for integers below 2^53. May be
  // empty when world_size is 1.
  std::function<double(double)> sum;
};

class Checkpointer {
 public:
  Checkpointer(CheckpointOptions options, CheckpointGroup group, core::Backend& backend);
  // Without a backend, for tools and tests whose tensors are all on the host (a device tensor
  // is then an error).
  Checkpointer(CheckpointOptions options, CheckpointGroup group);

  // Collective. Writes checkpoint `state.step` from every rank's slices (see the file comment)
  // and returns its directory. Slices of one buffer must tile [0, global_numel) exactly across
  // ranks. Replaces a checkpoint of the same step, and removes checkpoints of later steps
  // (they belong to a run that was resumed from an earlier point, and would otherwise be
  // resumed from next time). Of the older ones it keeps options().keep intact ones: one that
  // load_latest found damaged counts for none and goes when an intact one older than it goes
  // (kept until then, for a look at what damaged it).
  std::string save(const CheckpointState& state, const std::vector<BufferSlice>& slices);

  // Collective. Loads the newest checkpoint that verifies completely: fills every slice and
  // returns its state (with `world_size` the world size at save time). Returns nullopt when
  // `dir` holds no checkpoint at all. One that was removed while it was read (by a run saving
  // there) is no damage: the directory is listed again. Throws core::Error when the ranks list
  // different checkpoints in `dir`, when checkpoints exist but none is intact, when a file of the
  // one being loaded could not be read (CheckpointUnreadable: an I/O error, not damage), or when
  // the newest intact one does not fit: its parameter layout differs from `layout`
  // (CheckpointMisfit), or a slice's buffer is missing or has another size. A checkpoint from
  // before vocabularies were padded to whole 128-row tiles fits: its embedding rows load into
  // the first rows, the padding rows as zero. After a throw the slices' contents are
  // unspecified.
  std::optional<CheckpointState> load_latest(const std::vector<ParameterLayout>& layout,
                                             const std::vector<BufferSlice>& slices);

  // Collective. Loads checkpoint `step` as load_latest loads the newest, with every check, but
  // with no fallback: nullopt when `dir` has no step_<step> directory (on every rank); throws
  // CheckpointDamaged when it does not verify (on any rank), CheckpointUnreadable when a file
  // of it could not be read, core::ConfigError when it does not fit.
  std::optional<CheckpointState> load_step(int64_t step, const std::vector<ParameterLayout>& layout,
                                           const std::vector<BufferSlice>& slices);

  // The steps of the step_* directories in `dir`, newest first (complete or not yet verified).
  std::vector<int64_t> steps() const;
  // What the newest checkpoint whose manifest verifies records, read without its payload (a
  // look before a load of many gigabytes); nullopt when no manifest verifies; throws
  // CheckpointUnreadable when a manifest could not be read. Not collective.
  std::optional<CheckpointState> newest_manifest() const;
  // Collective. steps(), checked to be the same list on every rank: throws core::Error on
  // every rank otherwise, each naming what it sees (a file system that shows the ranks
  // different directories).
  std::vector<int64_t> agreed_steps() const;

  const CheckpointOptions& options() const { return options_; }

 private:
  // Whether every rank passed true.
  bool agree(bool ok) const;
  // Collective, once some rank failed: the kind every rank's error takes, so that the job's
  // exit code does not depend on which rank ends it first. kConfig when any rank's failure
  // (`mine`, nullopt where this rank did not fail) was one (no permission, something in the
  // way: exit 2 tells the operator that running again fails again); else kFailure, whatever
  // other kind a rank's own error had.
  core::ErrorKind agreed_kind(std::optional<core::ErrorKind> mine) const;
  // Runs `phase` on this rank, then agrees with every rank on whether it succeeded: throws
  // core::Error of agreed_kind on every rank when it failed on any.
  void collective(const std::string& what, const std::function<void()>& phase);
  const void* host_bytes(const core::Tensor& t, core::Tensor& staging);
  void write_payload(const std::string& dir, const std::vector<BufferSlice>& slices,
                     ShardIndex& index);
  CheckpointState load_one(int64_t step, const std::vector<ParameterLayout>& layout,
                           const std::vector<BufferSlice>& slices);
  // Collective load_one: the state when checkpoint `step` verified on every rank; nullopt when it
  // is damaged somewhere (`damage` then says how, on the ranks where it is); throws
  // core::ConfigError on every rank when it is intact but does not fit, CheckpointUnreadable
  // when a rank could not read a file of it.
  std::optional<CheckpointState> load_agreed(int64_t step,
                                             const std::vector<ParameterLayout>& layout,
                                             const std::vector<BufferSlice>& slices,
                                             std::string& damage);

  CheckpointOptions options_;
  CheckpointGroup group_;
  core::Backend* backend_ = nullptr;
  // Steps a load_latest of this object fell back past: a save's pruning does not count them
  // toward `keep` (see save).
  std::set<int64_t> damaged_steps_;
};

// "step_00000042".
std::string checkpoint_dir_name(int64_t step);

}  // namespace mantissa::checkpoint
