#include "train/data/corpus.h"

#include <algorithm>
#include <cstring>
#include <sstream>
#include <utility>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/read_file.h"
#include "train/data/synthetic.h"

namespace mantissa::train {

namespace {
// Mixed into the run's seed for the synthetic validation corpus ("validate" in ASCII).
constexpr uint64_t kValidationSeedSalt = 0x76616c6964617465ULL;

// Token i of tokens stored `token_bytes` (2 or 4) wide, little-endian as on every supported CPU.
uint32_t stored_id(const char* stored, size_t i, int token_bytes) {
  if (token_bytes == 2) {
    uint16_t id;
    std::memcpy(&id, stored + 2 * i, 2);
    return id;
  }
  uint32_t id;
  std::memcpy(&id, stored + 4 * i, 4);
  return id;
}
}  // namespace

TokenSegment::TokenSegment(std::string name, std::span<const uint16_t> tokens)
    : TokenSegment(std::move(name), tokens.data(), static_cast<int64_t>(tokens.size()), 2) {}

TokenSegment::TokenSegment(std::string name, std::span<const uint32_t> tokens)
    : TokenSegment(std::move(name), tokens.data(), static_cast<int64_t>(tokens.size()), 4) {}

TokenSegment::TokenSegment(std::string name, const void* data, int64_t size, int token_bytes)
    : name_(std::move(name)), data_(data), size_(size), token_bytes_(token_bytes) {
  MANTISSA_CHECK(token_bytes == 2 || token_bytes == 4,
                 "'" << name_ << "': tokens of " << token_bytes << " bytes (2 or 4)");
}

TokenSegment::TokenSegment(std::shared_ptr<const TokenFile> file, int64_t first_byte, int64_t size,
                           int token_bytes)
    : TokenSegment(file->path(), nullptr, size, token_bytes) {
  file_ = std::move(file);
  first_byte_ = first_byte;
}

const void* TokenSegment::data() const {
  MANTISSA_CHECK(file_ == nullptr,
                 "'" << name_ << "': a segment of a file has no tokens in memory");
  return data_;
}

TokenSegment TokenSegment::subspan(int64_t offset, int64_t count) const {
  MANTISSA_CHECK(offset >= 0 && count >= 0 && offset + count <= size_,
                 "'" << name_ << "': tokens [" << offset << ", " << offset + count
                     << ") lie outside the segment's " << size_);
  TokenSegment view = *this;
  if (file_ == nullptr) view.data_ = static_cast<const char*>(data_) + offset * token_bytes_;
  view.size_ = count;
  view.position_ = position_ + offset;
  return view;
}

template <typename Use>
void TokenSegment::with_stored(int64_t offset, int64_t count, Use&& use) const {
  MANTISSA_CHECK(offset >= 0 && count >= 0 && offset + count <= size_,
                 "'" << name_ << "': tokens [" << offset << ", " << offset + count
                     << ") lie outside the segment's " << size_);
  if (file_ == nullptr) {
    use(static_cast<const char*>(data_) + offset * token_bytes_);
    return;
  }
  std::vector<char> stored(static_cast<size_t>(count * token_bytes_));
  file_->read(first_byte_ + (position_ + offset) * token_bytes_, stored);
  use(stored.data());
}

void TokenSegment::read_ids(int64_t offset, std::span<uint32_t> out) const {
  with_stored(offset, static_cast<int64_t>(out.size()), [&](const char* stored) {
    for (size_t i = 0; i < out.size(); ++i) out[i] = stored_id(stored, i, token_bytes_);
  });
}

uint32_t TokenSegment::at(int64_t i) const {
  uint32_t id = 0;
  read_ids(i, std::span<uint32_t>(&id, 1));
  return id;
}

void TokenSegment::read(int64_t offset, std::span<int32_t> out, int64_t vocab_size) const {
  with_stored(offset, static_cast<int64_t>(out.size()), [&](const char* stored) {
    for (size_t i = 0; i < out.size(); ++i) {
      const uint32_t token = stored_id(stored, i, token_bytes_);
      if (token >= vocab_size) {
        std::ostringstream message;
        message << "'" << name_ << "': token " << token << " at position "
                << position_ + offset + static_cast<int64_t>(i) << " is >= vocab_size "
                << vocab_size << " (data written for a larger vocabulary, or corrupt)";
        throw core::ConfigError(message.str());
      }
      out[i] = static_cast<int32_t>(token);
    }
  });
}

Corpus Corpus::synthetic(uint64_t seed, int64_t n_tokens) {
  auto tokens = std::make_shared<const std::vector<uint16_t>>(synthetic_tokens(seed, n_tokens));
  Corpus corpus;
  corpus.name_ = "synthetic";
  corpus.vocab_size_ = 256;
  corpus.segments_.emplace_back("synthetic", *tokens);
  corpus.storage_.push_back(tokens);
  return corpus;
}

Corpus Corpus::synthetic_validation(uint64_t seed, int64_t n_tokens) {
  Corpus corpus = synthetic(core::mix64(seed ^ kValidationSeedSalt), n_tokens);
  corpus.name_ = "synthetic (validation)";
  return corpus;
}

Corpus Corpus::text_file(const std::string& path) {
  const std::string bytes = core::read_whole_file(path, "text file");
  MANTISSA_REQUIRE(!bytes.empty(), kConfig, "text file '" << path << "' is empty");
  // A token shard given as text would train on its header and its ids' bytes, without a word.
  if (bytes.size() >= sizeof(int32_t)) {
    int32_t magic = 0;
    std::memcpy(&magic, bytes.data(), sizeof magic);
    MANTISSA_REQUIRE(magic != kShardMagic && magic != kLlama3ShardMagic, kConfig,
                     "text file '" << path << "' is an llm.c token shard (magic " << magic
                                   << "), not text: name shards in data.token_shards.pattern");
  }

  // Bytes go through unsigned char: a signed char would turn 0x80..0xFF into negative tokens.
  auto tokens = std::make_shared<std::vector<uint16_t>>(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) (*tokens)[i] = static_cast<unsigned char>(bytes[i]);
  Corpus corpus;
  corpus.name_ = path;
  corpus.vocab_size_ = 256;
  corpus.segments_.emplace_back(path, *tokens);
  corpus.storage_.push_back(tokens);
  return corpus;
}

std::pair<Corpus, Corpus> Corpus::split_tail(double fraction) const {
  MANTISSA_CHECK(fraction >= 0.0 && fraction < 1.0,
                 "corpus '" << name_ << "': held-out fraction " << fraction << " not in [0, 1)");
  Corpus head, tail;
  head.name_ = name_;
  tail.name_ = name_ + " (validation)";
  head.vocab_size_ = tail.vocab_size_ = vocab_size_;
  head.storage_ = tail.storage_ = storage_;
  // Tokens still to hand to the head, walking the segments in order.
  int64_t keep = num_tokens() - static_cast<int64_t>(static_cast<double>(num_tokens()) * fraction);
  for (const TokenSegment& s : segments_) {
    const int64_t n = s.size();
    const int64_t in_head = std::min(keep, n);
    if (in_head > 0) head.segments_.push_back(s.subspan(0, in_head));
    if (in_head < n) tail.segments_.push_back(s.subspan(in_head, n - in_head));
    keep -= in_head;
  }
  return {std::move(head), std::move(tail)};
}

uint64_t Corpus::fingerprint() const {
  uint64_t hash = 0;
  const auto add = [&hash](uint64_t value) { hash = core::mix64(hash ^ value); };
  for (const TokenSegment& s : segments_) {
    add(static_cast<uint64_t>(s.size()));
    std::vector<uint32_t> sample(static_cast<size_t>(std::min(kFingerprintSample, s.size())));
    const auto n = static_cast<int64_t>(sample.size());
    for (const int64_t first : {int64_t{0}, (s.size() - n) / 2, s.size() - n}) {
      s.read_ids(first, sample);
      for (const uint32_t id : sample) add(id);
    }
  }
  return hash;
}

int64_t Corpus::num_tokens() const {
  int64_t n = 0;
  for (const TokenSegment& s : segments_) n += s.size();
  return n;
}

}  // namespace mantissa::train
