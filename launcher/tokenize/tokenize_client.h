// A SentencePiece tokenizer used from the mantissa executable, which cannot load SentencePiece
// itself (launcher/tokenize/tokenize.h): every call runs mantissa-tokenize, the executable beside
// this one, with `info`, `ids` or `text` (launcher/tokenize/tokenize_ids.h) and talks to it over
// pipes.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mantissa::launcher {

class TokenizerClient {
 public:
  // Loads the model at `model_path` once to learn its vocabulary. Throws core::ConfigError
  // with mantissa-tokenize's message when the model cannot be loaded or is not one that
  // decodes exactly, core::Error when mantissa-tokenize cannot be run.
  explicit TokenizerClient(std::string model_path);

  const std::string& path() const { return path_; }
  int64_t vocab_size() const { return vocab_size_; }
  int32_t eot() const { return eot_; }  // end of text, which starts every document
  // Ids encoded text never holds (Tokenizer::never_encoded): <unk>, <s>.
  const std::vector<int32_t>& never_encoded() const { return never_encoded_; }

  // The ids of UTF-8 `text`; core::ConfigError for text that is not valid UTF-8.
  std::vector<int32_t> encode(const std::string& text) const;
  // The text of `ids` (each in [0, vocab_size)), exactly; end-of-text ids give nothing.
  std::string decode(std::span<const int32_t> ids) const;

 private:
  // Runs mantissa-tokenize `subcommand` --tokenizer path() with `input` on its stdin; returns
  // its stdout. Its failure becomes core::ConfigError (exit code 2) or core::Error (any other
  // failure), with its message after `what` (when not empty: the input it was given).
  std::string run(const std::string& subcommand, const std::string& input,
                  const std::string& what) const;

  std::string path_;
  int64_t vocab_size_ = 0;
  int32_t eot_ = 0;
  std::vector<int32_t> never_encoded_;
};

}  // namespace mantissa::launcher
