// Writing the output of `mantissa tokenize`: llm.c token shards (the format and the reader are
// in train/data/corpus.h) and the tokenizer model, such that a failure leaves nothing
// half-written: every file is first written and fsynced under a hidden temporary name
// (.NAME.tmp) and renamed into place only once all of them are complete.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "launcher/tokenize/tokenize_model.h"
#include "train/data/corpus.h"

namespace mantissa::launcher {

// The last position p <= pos where a shard, or a piece decoded on its own, may start: 0,
// tokens.size(), or a token that does not continue a character's bytes (Tokenizer::can_start_at).
int64_t start_at_or_before(const Tokenizer& tokenizer, const train::TokenSegment& tokens,
                           int64_t pos);

// Cuts `tokens` into shards of at most `max_tokens` tokens (at least 4, the longest UTF-8
// character), each ending early where needed so that the next one can start there: the
// [begin, end) ranges, in order, covering all tokens (none for an empty segment).
std::vector<std::pair<int64_t, int64_t>> plan_shards(const Tokenizer& tokenizer,
                                                     const train::TokenSegment& tokens,
                                                     int64_t max_tokens);

// The token stream of one `mantissa tokenize encode` run, written to a temporary file as it is
// produced, in the shards' width, and mapped back to be cut into shards: memory holds only the
// text's chunks in flight, not the stream. The file has no name (it is unlinked as soon as it is
// created), so neither a crash nor a user's file of the same name can be hurt by it.
class TokenSpill {
 public:
  // A file in `dir` for tokens of `token_bytes` (2 or 4) bytes. Throws core::Error naming the
  // directory when it cannot be created.
  TokenSpill(const std::string& dir, int token_bytes);
  ~TokenSpill();
  TokenSpill(const TokenSpill&) = delete;
  TokenSpill& operator=(const TokenSpill&) = delete;

  // Appends `tokens`, each below 2^(8 * token_bytes). Throws core::Error naming the file when
  // it cannot be written (a full disk).
  void append(std::span<const uint32_t> tokens);
  // Every token appended, mapped read-only; valid while this lives. No append may follow.
  train::TokenSegment map();

 private:
  std::string path_;  // the name it was created under, for messages
  int token_bytes_;
  int fd_ = -1;
  int64_t tokens_ = 0;
  std::vector<char> buffer_;
  void* mapping_ = nullptr;
};

// The files of one `mantissa tokenize encode` run, staged in one output directory.
class StagedOutput {
 public:
  // Output into `dir`, created (with its parents) when missing. Throws core::ConfigError when
  // `dir` is not a directory or cannot be created, holds a file that training's pattern
  // (train_*.bin, val_*.bin) would read but that is no shard name encode writes, or already
  // holds shards or a tokenizer.model and `replace` is false.
  StagedOutput(std::string dir, bool replace);
  // Unless commit() ran: removes every temporary file, and the directories this created.
  ~StagedOutput();
  StagedOutput(const StagedOutput&) = delete;
  StagedOutput& operator=(const StagedOutput&) = delete;

  const std::string& dir() const { return dir_; }
  // The files already in dir that commit() may replace or remove: shards and tokenizer.model
  // (none unless `replace`, which refused them otherwise).
  std::vector<std::string> replaced_files() const;
  // Writes the shard `name` (in dir) under its hidden temporary name (".<name>.tmp", which no
  // glob without a leading '.' matches): a GPT-2 shard for 2-byte tokens,
  // a Llama-3 shard for 4-byte ones. Throws core::Error naming the file when it cannot be
  // written.
  void write_shard(const std::string& name, const train::TokenSegment& tokens);
  // The same for any other file.
  void write_file(const std::string& name, std::string_view bytes);
  // Renames every file into place, then removes the shards a replaced output held that this
  // one does not rewrite (a stale train_000007.bin would still match the training glob) and
  // the staged files an encode killed before its commit left, all
  // under train::kUnfinishedShardsMarker: a failure (or a crash) on the way leaves the marker,
  // and training refuses the directory until an encode finishes there.
  void commit();

 private:
  std::string dir_;
  std::vector<std::filesystem::path> created_dirs_;  // deepest first
  std::vector<std::string> held_;                    // output names in dir_ before this run
  std::vector<std::string> staged_;                  // final names, in dir
  bool committed_ = false;
};

}  // namespace mantissa::launcher
