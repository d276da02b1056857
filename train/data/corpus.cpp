#include "train/data/corpus.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/error.h"
#include "train/data/synthetic.h"

namespace mantissa::train {

Corpus Corpus::synthetic(uint64_t seed, int64_t n_tokens) {
  auto tokens = std::make_shared<const std::vector<uint16_t>>(synthetic_tokens(seed, n_tokens));
  Corpus corpus;
  corpus.name_ = "synthetic";
  corpus.vocab_size_ = 256;
  corpus.segments_.push_back({"synthetic", *tokens});
  corpus.storage_.push_back(tokens);
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

int64_t Corpus::num_tokens() const {
  int64_t n = 0;
  for (const TokenSegment& s : segments_) n += static_cast<int64_t>(s.tokens.size());
  return n;
}

}  // namespace mantissa::train
