#include "launcher/tokenize/tokenize_decode.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "launcher/tokenize/tokenize_model.h"
#include "launcher/tokenize/tokenize_shards.h"
#include "train/data/corpus.h"

namespace mantissa::launcher {

namespace {

// Tokens decoded at a time, so that the text of a large shard never sits in memory whole.
constexpr size_t kDecodeTokens = size_t{1} << 20;

// `path` as a glob pattern that matches itself only.
std::string glob_literal(const std::string& path) {
  std::string pattern;
  for (const char c : path) {
    if (c == '*' || c == '?' || c == '[' || c == '\\') pattern += '\\';
    pattern += c;
  }
  return pattern;
}

// The shard's tokens, checked by the reader training uses (header, size, every id < vocab).
train::Corpus read_shard(const std::string& path, int vocab_size) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    throw core::ConfigError("cannot read shard '" + path + "': " + std::strerror(errno));
  }
  try {
    return train::Corpus::token_shards(glob_literal(path), vocab_size);
  } catch (const core::Error& e) {
    throw core::ConfigError(e.what());
  }
}

}  // namespace

void decode_shards(const std::string& tokenizer_path, const std::vector<std::string>& inputs,
                   std::FILE* out) {
  const Tokenizer tokenizer(tokenizer_path);
  // Every shard's header is checked before any text is written; then each is opened again as
  // it is decoded, so that one file is open at a time, however many shards (thousands held
  // open would pass the limit on open files).
  for (const std::string& path : inputs) read_shard(path, tokenizer.vocab_size());

  // Decodes `pending` up to the last token where a piece may start (all of it when `all`): a
  // character's byte tokens are decoded together, whichever shards they lie in.
  std::vector<uint32_t> pending;
  auto flush = [&](bool all) {
    const int64_t size = static_cast<int64_t>(pending.size());
    const size_t n = static_cast<size_t>(
        all || pending.empty()
            ? size
            : start_at_or_before(tokenizer, train::TokenSegment("decoded", pending), size - 1));
    const std::string text = tokenizer.decode(std::span<const uint32_t>(pending).first(n));
    MANTISSA_REQUIRE(std::fwrite(text.data(), 1, text.size(), out) == text.size(), kFailure,
                     "cannot write the decoded text: " << std::strerror(errno));
    pending.erase(pending.begin(), pending.begin() + static_cast<ptrdiff_t>(n));
  };
  std::vector<int32_t> part;
  for (const std::string& path : inputs) {
    const train::Corpus shard = read_shard(path, tokenizer.vocab_size());
    for (const train::TokenSegment& segment : shard.segments()) {
      for (int64_t at = 0; at < segment.size(); at += static_cast<int64_t>(part.size())) {
        // read() checks every id against the tokenizer's vocabulary.
        part.resize(std::min(kDecodeTokens, static_cast<size_t>(segment.size() - at)));
        segment.read(at, part, shard.vocab_size());
        pending.insert(pending.end(), part.begin(), part.end());
        if (pending.size() >= kDecodeTokens) flush(false);
      }
    }
  }
  flush(true);
  MANTISSA_REQUIRE(std::fflush(out) == 0, kFailure,
                   "cannot write the decoded text: " << std::strerror(errno));
}

}  // namespace mantissa::launcher
