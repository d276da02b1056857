#include "train/data/corpus.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "train/data/synthetic.h"

namespace mantissa::train {

namespace {
// Mixed into the run's seed for the synthetic validation corpus ("validate" in ASCII).
constexpr uint64_t kValidationSeedSalt = 0x76616c6964617465ULL;
}  // namespace

Corpus Corpus::synthetic(uint64_t seed, int64_t n_tokens) {
  auto tokens = std::make_shared<const std::vector<uint16_t>>(synthetic_tokens(seed, n_tokens));
  Corpus corpus;
  corpus.name_ = "synthetic";
  corpus.vocab_size_ = 256;
  corpus.segments_.push_back({"synthetic", *tokens});
  corpus.storage_.push_back(tokens);
  return corpus;
}

Corpus Corpus::synthetic_validation(uint64_t seed, int64_t n_tokens) {
  Corpus corpus = synthetic(core::mix64(seed ^ kValidationSeedSalt), n_tokens);
  corpus.name_ = "synthetic (validation)";
  return corpus;
}

Corpus Corpus::text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MANTISSA_CHECK(in, "text file '" << path << "': cannot open: " << std::strerror(errno));
  const std::vector<char> bytes{std::istreambuf_iterator<char>(in),
                                std::istreambuf_iterator<char>()};
  MANTISSA_CHECK(!in.bad(), "text file '" << path << "': read failed: " << std::strerror(errno));
  MANTISSA_CHECK(!bytes.empty(), "text file '" << path << "' is empty");

  // Bytes go through unsigned char: a signed char would turn 0x80..0xFF into negative tokens.
  auto tokens = std::make_shared<std::vector<uint16_t>>(bytes.size());
  for (size_t i = 0; i < bytes.size(); ++i) (*tokens)[i] = static_cast<unsigned char>(bytes[i]);
  Corpus corpus;
  corpus.name_ = path;
  corpus.vocab_size_ = 256;
  corpus.segments_.push_back({path, *tokens});
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
    const auto n = static_cast<int64_t>(s.tokens.size());
    const int64_t in_head = std::min(keep, n);
    if (in_head > 0) head.segments_.push_back({s.name, s.tokens.first(in_head)});
    if (in_head < n) tail.segments_.push_back({s.name, s.tokens.subspan(in_head)});
    keep -= in_head;
  }
  return {std::move(head), std::move(tail)};
}

int64_t Corpus::num_tokens() const {
  int64_t n = 0;
  for (const TokenSegment& s : segments_) n += static_cast<int64_t>(s.tokens.size());
  return n;
}

}  // namespace mantissa::train
