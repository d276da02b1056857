// Token corpora: where the training tokens come from.
//
// A Corpus is a list of segments, each a contiguous run of tokens (a text file, one token
// shard, the synthetic buffer). Training windows never cross a segment boundary. Segments are
// read-only views: shards stay memory-mapped (the page cache is shared by every rank on a node
// instead of each rank holding a copy), other sources own a buffer. Copies of a Corpus share
// the same memory.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace mantissa::train {

struct TokenSegment {
  std::string name;  // the file it came from, or "synthetic"
  std::span<const uint16_t> tokens;
};

// llm.c token shard format: a header of 256 int32 (magic, version, token count, rest unused)
// then `count` uint16 tokens, little-endian; the file size is exactly 1024 + 2 * count bytes.
inline constexpr int32_t kShardMagic = 20240520;
inline constexpr int32_t kShardVersion = 1;
inline constexpr int32_t kLlama3ShardMagic = 20240801;  // llm.c's uint32 shards (version 7)
inline constexpr int64_t kShardHeaderInts = 256;
inline constexpr int64_t kShardHeaderBytes = kShardHeaderInts * 4;

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
  // Every file matching the glob `pattern`, in sorted order, one segment each. Each file is
  // validated on load (header, size, every token < vocab_size); any problem throws core::Error
  // naming the file and what is wrong.
  static Corpus token_shards(const std::string& pattern, int vocab_size);

  // The corpus cut in two at a token: the head keeps all but the last `fraction` of the
  // tokens (rounded down), the tail holds those (a validation set that is never trained on).
  // Both share this corpus's memory.
  std::pair<Corpus, Corpus> split_tail(double fraction) const;

  const std::string& name() const { return name_; }  // what was configured, for messages
  int vocab_size() const { return vocab_size_; }
  const std::vector<TokenSegment>& segments() const { return segments_; }
  int64_t num_tokens() const;

 private:
  std::string name_;
  int vocab_size_ = 0;
  std::vector<TokenSegment> segments_;
  std::vector<std::shared_ptr<const void>> storage_;  // keeps the segments' memory alive
};

}  // namespace mantissa::train
