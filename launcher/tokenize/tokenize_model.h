// A SentencePiece model as `mantissa tokenize` uses it: token ids (up to train::kMaxVocab), an
// end-of-text token, and decoding that gives back the encoded text byte for byte.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}  // namespace sentencepiece

namespace mantissa::launcher {

// SentencePiece writes every space as U+2581 (LOWER ONE EIGHTH BLOCK) before it encodes, and
// decodes every U+2581 back to a space.
inline constexpr std::string_view kSpaceSymbol = "\xE2\x96\x81";

// What went wrong, from a SentencePiece error message: "Internal: ./src/trainer_interface.cc(660)
// [(condition)] What went wrong." gives "What went wrong."; empty when the message holds only
// the source location and the failed condition.
std::string sentencepiece_reason(std::string_view message);

class Tokenizer {
 public:
  // Loads the model file at `path`. Throws core::ConfigError naming it when it is missing, not a
  // regular file, empty or unparsable, has more than train::kMaxVocab pieces or no end-of-text
  // piece (</s>), or does not give back a probe text exactly (a model that normalises text, or
  // one without byte fallback); a read that fails (an I/O error) is a failure
  // (core::read_whole_file).
  explicit Tokenizer(const std::string& path);
  // The same from a model already in memory (`path` names it in messages).
  Tokenizer(const std::string& path, std::string model_bytes);
  ~Tokenizer();

  const std::string& path() const { return path_; }
  // The model file as read, to copy beside the shards.
  const std::string& model_bytes() const { return model_bytes_; }
  int vocab_size() const { return vocab_size_; }
  // End of text: the model's </s>, which llm.c's format puts before every document.
  uint32_t eot() const { return eot_; }
  // The ids that encoded text never holds: <unk> (byte fallback encodes any text) and the
  // control pieces other than end of text (<s>). Generated text should not hold them either.
  const std::vector<uint32_t>& never_encoded() const { return never_encoded_; }

  // Appends the tokens of `text` (valid UTF-8) to `out`. Safe to call from several threads.
  void encode(std::string_view text, std::vector<uint32_t>& out) const;
  // The text of `tokens`; end-of-text tokens give nothing.
  std::string decode(std::span<const uint32_t> tokens) const;
  // False for the byte token of a UTF-8 continuation byte (0x80-0xBF). A character outside the
  // vocabulary is encoded as its 2 to 4 byte tokens; decoded apart, each half of them would
  // become U+FFFD, so a shard, or a piece decoded on its own, never starts at such a token.
  bool can_start_at(uint32_t token) const { return !continuation_[token]; }

 private:
  std::string path_;
  std::string model_bytes_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> processor_;
  int vocab_size_ = 0;
  uint32_t eot_ = 0;
  std::vector<uint32_t> space_symbol_bytes_;  // byte tokens of U+2581's UTF-8, E2 96 81
  std::vector<bool> continuation_;            // per token id
  std::vector<uint32_t> never_encoded_;
};

}  // namespace mantissa::launcher
