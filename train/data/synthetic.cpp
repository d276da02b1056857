#include "train/data/synthetic.h"

#include <string>

#include "core/dtype/dtype.h"
#include "core/error.h"

namespace mantissa::train {

namespace {

// Distinguishes this generator's random stream from other users of the same run seed (the
// data loader's window sampler), so the two are not correlated.
constexpr uint64_t kStreamTag = 0x73796e7468657469ULL;  // "synthetic"

class LineGenerator {
 public:
  explicit LineGenerator(uint64_t seed) : seed_(core::mix64(seed ^ kStreamTag)) {}

  void append_line(std::string& out) {
    switch (below(4)) {
      case 0: sentence(out); break;
      case 1: copy(out); break;
      case 2: sum(out); break;
      default: count(out); break;
    }
    out += '\n';
  }

 private:
  // Uniform in [0, n); the modulo bias of a 32-bit draw is irrelevant for n this small.
  int below(int n) { return static_cast<int>(core::random_u32(seed_, counter_++) % n); }

  template <size_t N>
  std::string_view pick(const std::string_view (&words)[N]) {
    return words[below(static_cast<int>(N))];
  }

  void noun_phrase(std::string& out) {
    out += pick(kSyntheticDeterminers);
    out += ' ';
    if (below(2) == 1) {
      out += pick(kSyntheticAdjectives);
      out += ' ';
    }
    out += pick(kSyntheticNouns);
  }

  void sentence(std::string& out) {
    noun_phrase(out);
    out += ' ';
    out += pick(kSyntheticVerbs);
    out += ' ';
    noun_phrase(out);
    out += '.';
  }

  void copy(std::string& out) {
    std::string word(3 + below(6), ' ');
    for (char& c : word) c = static_cast<char>('a' + below(26));
    out += "copy " + word + ' ' + word;
  }

  void sum(std::string& out) {
    const int a = below(100);
    const int b = below(100);
    out += std::to_string(a) + '+' + std::to_string(b) + '=' + std::to_string(a + b);
  }

  void count(std::string& out) {
    const int n = below(96);
    out += "count";
    for (int i = 0; i < 5; ++i) out += ' ' + std::to_string(n + i);
  }

  uint64_t seed_;
  uint64_t counter_ = 0;
};

}  // namespace

std::vector<uint16_t> synthetic_tokens(uint64_t seed, int64_t n_tokens) {
  MANTISSA_CHECK(n_tokens >= 1, "synthetic corpus: n_tokens must be >= 1, got " << n_tokens);
  LineGenerator generator(seed);
  std::string text;
  text.reserve(static_cast<size_t>(n_tokens) + 64);
  while (static_cast<int64_t>(text.size()) < n_tokens) generator.append_line(text);
  std::vector<uint16_t> tokens(static_cast<size_t>(n_tokens));
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

}  // namespace mantissa::train
