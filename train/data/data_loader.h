// DataLoader: this rank's slice of each global batch, from a stream that no rank count changes.
//
// The global stream is an endless sequence of windows of T + 1 tokens, window k a pure
// function of (corpus, seed, epoch origin o, k), by one of two samplings:
//  - epochs (the default): each segment is cut into windows laid end to end, starting at
//    positions 0, T, 2T, ... (consecutive windows share one token: the last target of one is
//    the first input of the next), and each epoch of W windows (all segments' together) takes
//    every window once, in an order shuffled by (seed, epoch): window k is window
//    permutation_e((k - o) mod W) of epoch e = (k - o) / W. Every token but a segment's first
//    is a target once an epoch; a segment's last (n - 1) mod T tokens are not read. As
//    Megatron-LM's GPT dataset and llm.c's shuffled loader read. The epoch origin o is window
//    0, or where a resume moved to other windows or another order (start_epochs_here), so
//    that they begin with a whole epoch.
//  - random: each window starts at a position drawn uniformly from every position where T + 1
//    tokens fit inside one segment, by a counter-based hash of (seed, k): sampling with
//    replacement, as nanoGPT does (o moves only the epoch count). A budget of one corpus's
//    worth of tokens leaves about e^-1 = 37% of them unread.
// A pure function needs no shuffling state:
//  - one call of next() consumes the global batch of world_size * micro_batch windows
//    [cursor, cursor + world_size * micro_batch); rank r takes windows
//    cursor + r * micro_batch + [0, micro_batch) and the cursor moves past the whole batch, so
//    at step s (one call per step) the global batch is windows [s*G, (s+1)*G), G the global
//    batch size, whatever the number of ranks;
//  - the cursor is two integers (the next window and o); restoring it resumes the stream
//    exactly, under any world size (same global batch size: the same batches; another one: the
//    same stream, cut differently).
// Tokens of window k are inputs at positions [0, T) and targets at positions [1, T].
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "train/data/corpus.h"

namespace mantissa::train {

enum class WindowSampling { kEpochs, kRandom };

struct DataLoaderConfig {
  int64_t seq_len = 0;      // T
  int64_t micro_batch = 0;  // B: windows per rank per call
  int world_size = 1;
  int rank = 0;
  uint64_t seed = 0;
  WindowSampling sampling = WindowSampling::kEpochs;
};

struct Batch {
  int64_t batch_size = 0;        // B
  int64_t seq_len = 0;           // T
  std::vector<int32_t> tokens;   // [B, T] row-major
  std::vector<int32_t> targets;  // [B, T]: the token that follows each input token
};

// The loader's position in the global stream; a checkpoint stores it.
struct DataCursor {
  int64_t next_window = 0;  // windows handed out so far, all ranks together
  // The window the data's first epoch begins at: 0, or where a resume changed the windows or
  // their order under the cursor (DataLoader::start_epochs_here).
  int64_t epoch_origin = 0;

  bool operator==(const DataCursor&) const = default;
};

// No segment of the corpus holds T + 1 tokens: a configuration error whose remedy (the data,
// the context, what is held out) the caller names.
class TrainingDataTooShort : public core::ConfigError {
 public:
  TrainingDataTooShort(const std::string& what, int64_t longest)
      : core::ConfigError(what), longest_(longest) {}
  int64_t longest() const { return longest_; }  // tokens of the longest segment

 private:
  int64_t longest_;
};

class DataLoader {
 public:
  // Throws TrainingDataTooShort when no segment of the corpus holds T + 1 tokens, core::Error
  // for a bad config.
  DataLoader(std::shared_ptr<const Corpus> corpus, const DataLoaderConfig& config);

  // This rank's slice of the next global batch.
  Batch next();
  // Window k of the global stream: T + 1 tokens into `out`.
  void read_window(int64_t k, std::span<int32_t> out) const;

  // The windows that hold the corpus once, laid end to end: an epoch of the epochs sampling,
  // and a corpus's worth of windows of the random sampling.
  int64_t windows_per_epoch() const { return windows_per_epoch_; }
  // Epochs of the stream read so far: the cursor's windows since the epoch origin over
  // windows_per_epoch().
  double epochs_read() const {
    return static_cast<double>(cursor_.next_window - cursor_.epoch_origin) /
           static_cast<double>(windows_per_epoch_);
  }

  DataCursor cursor() const { return cursor_; }
  void set_cursor(const DataCursor& cursor);
  // The data's first epoch begins at the cursor: for a resume whose windows or their order
  // differ from the checkpoint's, so that its epochs read each window once from the start.
  void start_epochs_here() { cursor_.epoch_origin = cursor_.next_window; }

  // The segments shorter than T + 1 tokens, which no window reads, as "<name> (<n> tokens)".
  std::vector<std::string> unread_segments() const;

 private:
  std::shared_ptr<const Corpus> corpus_;
  DataLoaderConfig config_;
  uint64_t stream_seed_;
  // The slot of window k: its place among all windows of an epoch (epochs) or among all
  // window starts (random).
  int64_t slot_of(int64_t k) const;

  // slots_end_[i]: number of window slots in segments [0, i]: windows laid end to end
  // (epochs), or window starts (random); the last entry is their total.
  std::vector<int64_t> slots_end_;
  int64_t windows_per_epoch_ = 0;
  DataCursor cursor_;
};

}  // namespace mantissa::train
