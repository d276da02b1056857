// DataLoader: this rank's slice of each global batch, from a stream that no rank count changes.
//
// The global stream is an endless sequence of windows of T + 1 tokens. Window k starts at a
// position drawn uniformly from all positions of the corpus where T + 1 tokens fit inside one
// segment, by a counter-based hash of (seed, k): sampling with replacement, as nanoGPT does.
// Window k is therefore a pure function of (corpus, seed, k), which gives everything the
// trainer needs without any shuffling state:
//  - one call of next() consumes the global batch of world_size * micro_batch windows
//    [cursor, cursor + world_size * micro_batch); rank r takes windows
//    cursor + r * micro_batch + [0, micro_batch) and the cursor moves past the whole batch, so
//    at step s (one call per step) the global batch is windows [s*G, (s+1)*G), G the global
//    batch size, whatever the number of ranks;
//  - the cursor is one integer; restoring it resumes the stream exactly, under any world size
//    (same global batch size: the same batches; another one: the same stream, cut differently).
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

struct DataLoaderConfig {
  int64_t seq_len = 0;      // T
  int64_t micro_batch = 0;  // B: windows per rank per call
  int world_size = 1;
  int rank = 0;
  uint64_t seed = 0;
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

  bool operator==(const DataCursor&) const = default;
};

// No segment of the corpus holds T + 1 tokens: a configuration error whose remedy (the data,
// the context, what is held out) the caller names.
class TrainingDataTooShort : public core::ConfigError {
 public:
  using core::ConfigError::ConfigError;
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

  DataCursor cursor() const { return cursor_; }
  void set_cursor(const DataCursor& cursor);

  // The segments shorter than T + 1 tokens, which no window reads, as "<name> (<n> tokens)".
  std::vector<std::string> unread_segments() const;

 private:
  std::shared_ptr<const Corpus> corpus_;
  DataLoaderConfig config_;
  uint64_t stream_seed_;
  // window_starts_end_[i]: number of valid window starts in segments [0, i]; the last entry is
  // the total a window index is drawn from.
  std::vector<int64_t> window_starts_end_;
  DataCursor cursor_;
};

}  // namespace mantissa::train
