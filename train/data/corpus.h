// Token corpora: where the training tokens come from.
//
// A Corpus is a list of segments, each a contiguous run of tokens (a text file, one token
// shard, the synthetic buffer). Training windows never cross a segment boundary. Segments are
// read-only views: shards stay open and are read a window at a time (train/data/token_file.h:
// the page cache is shared by every rank on a node instead of each rank holding a copy), other
// sources own a buffer. Copies of a Corpus share the same memory and files.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "train/data/token_file.h"

namespace mantissa::train {

// A contiguous run of tokens as stored: 2 bytes each (GPT-2 llm.c shards, text files, the
// synthetic corpus) or 4 (llm.c Llama-3 shards, for vocabularies past 65,536), in memory or in
// a file. A view: the Corpus that made it keeps the memory alive; a file stays open while any
// view of it does.
class TokenSegment {
 public:
  TokenSegment(std::string name, std::span<const uint16_t> tokens);
  TokenSegment(std::string name, std::span<const uint32_t> tokens);
  // `size` tokens of `token_bytes` (2 or 4) each at `data`, little-endian as files store them.
  TokenSegment(std::string name, const void* data, int64_t size, int token_bytes);
  // `size` tokens of `token_bytes` each in `file`, from byte `first_byte` on.
  TokenSegment(std::shared_ptr<const TokenFile> file, int64_t first_byte, int64_t size,
               int token_bytes);

  const std::string& name() const { return name_; }  // the file it came from, or "synthetic"
  int64_t size() const { return size_; }
  int token_bytes() const { return token_bytes_; }
  // The tokens as stored, of a segment in memory only (checked).
  const void* data() const;
  // Tokens [offset, offset + count) of this view.
  TokenSegment subspan(int64_t offset, int64_t count) const;
  // Tokens [offset, offset + out.size()) as stored, unchecked against any vocabulary.
  void read_ids(int64_t offset, std::span<uint32_t> out) const;
  // Token i, unchecked against any vocabulary (i must lie in [0, size())).
  uint32_t at(int64_t i) const;

  // Copies tokens [offset, offset + out.size()) into `out`, widened to int32. Token values are
  // checked here, as they are used, not when a corpus is opened: scanning a corpus of 10^11
  // tokens would take every rank minutes at every start. Throws core::ConfigError naming the
  // file and the token's position in it when one is >= vocab_size: a data file that does not
  // fit the configured model, which no retry mends.
  void read(int64_t offset, std::span<int32_t> out, int64_t vocab_size) const;

 private:
  // Passes the stored bytes of tokens [offset, offset + count) to `use`, from memory or read
  // from the file into a buffer.
  template <typename Use>
  void with_stored(int64_t offset, int64_t count, Use&& use) const;

  std::string name_;
  const void* data_ = nullptr;             // a segment in memory: token 0 of this view
  std::shared_ptr<const TokenFile> file_;  // a segment of a file: the file,
  int64_t first_byte_ = 0;                 // and the byte where the file's token 0 lies
  int64_t size_ = 0;
  int token_bytes_ = 2;
  int64_t position_ = 0;  // token 0 of this view: its index in its file (reads, messages)
};

// llm.c token shard format: a header of 256 int32 (magic, version, token count, rest unused)
// then `count` tokens, little-endian; the file size is exactly 1024 + width * count bytes.
// GPT-2 shards store uint16 tokens, Llama-3 shards (llm.c's dev/data for Llama 3) uint32.
inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kLlama3ShardMagic = 20240801;
inline constexpr int32_t kLlama3ShardVersion = 7;
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

// The tokenizer a directory of shards was encoded with, beside them (mantissa tokenize encode
// writes it there; training, export and sample look for it there).
inline constexpr const char* kShardsTokenizerFile = "tokenizer.model";

// Present in a directory while `mantissa tokenize encode` moves a set of shards into it: the
// files cannot all change in one step, and a failure or crash in between leaves a mix of the
// old and the new set, or part of one. Training refuses shards beside it.
inline constexpr const char* kUnfinishedShardsMarker = ".mantissa-encode-unfinished";

// The largest vocabulary a model or a tokenizer may have: four times Gemma's 256,000, the
// largest in use.
inline constexpr int64_t kMaxVocab = int64_t{1} << 20;

// Bytes per token of the shards written for a vocabulary: GPT-2 shards while ids fit uint16,
// as llm.c writes them, Llama-3 shards beyond.
constexpr int shard_token_bytes(int64_t vocab_size) {
  return vocab_size <= 65536 ? 2 : 4;
}

class Corpus {
 public:
  // The built-in synthetic corpus (train/data/synthetic.h), vocab 256.
  static Corpus synthetic(uint64_t seed, int64_t n_tokens = int64_t{1} << 21);
  // Another synthetic corpus for the same run, held out for evaluation: generated from a seed
  // derived from `seed`, so it never repeats the training corpus.
  static Corpus synthetic_validation(uint64_t seed, int64_t n_tokens);
  // Every byte of the file is a token (vocab 256). Throws core::Error naming the file when it
  // cannot be read or is empty.
  static Corpus text_file(const std::string& path);
  // Every file matching the glob `pattern`, in sorted order, one segment each; GPT-2 and
  // Llama-3 shards may be mixed. Each file's header and size are validated on load, its token
  // values as they are read (TokenSegment::read); any problem throws core::Error naming the
  // file and what is wrong.
  static Corpus token_shards(const std::string& pattern, int64_t vocab_size);

  // The corpus cut in two at a token: the head keeps all but the last `fraction` of the
  // tokens (rounded down), the tail holds those (a validation set that is never trained on).
  // Both share this corpus's memory.
  std::pair<Corpus, Corpus> split_tail(double fraction) const;

  const std::string& name() const { return name_; }  // what was configured, for messages
  int64_t vocab_size() const { return vocab_size_; }
  const std::vector<TokenSegment>& segments() const { return segments_; }
  int64_t num_tokens() const;
  // Identifies the tokens this corpus holds, so that a resumed run can tell whether its data
  // changed: core::mix64 folded over the segments in order, each one's size and a sample of
  // its token ids (kFingerprintSample at its start, middle and end). The same files give the
  // same value wherever they lie, whatever they are called and however wide their tokens are
  // stored; the same tokens cut into other files give another (windows never cross
  // a file, so the stream changes). It reads a sample, not the corpus (10^11 tokens would
  // take minutes), so files that differ only between the samples are not told apart.
  uint64_t fingerprint() const;
  static constexpr int64_t kFingerprintSample = 64;

 private:
  std::string name_;
  int64_t vocab_size_ = 0;
  std::vector<TokenSegment> segments_;
  std::vector<std::shared_ptr<const void>> storage_;  // keeps in-memory segments' tokens alive
};

}  // namespace mantissa::train
