// `mantissa tokenize train`: a SentencePiece model trained on UTF-8 text files, with the
// settings that make decoding exact.
#pragma once

#include <string>
#include <vector>

namespace mantissa::launcher {

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;
  int64_t vocab_size = 0;
  std::string model_type = "bpe";  // or "unigram"
  std::string out;
  bool force = false;  // replace an existing `out`
};

// Trains on every input file and writes the model to options.out (through a temporary file).
// Throws core::ConfigError for a vocabulary size outside [kMinTrainVocab, train::kMaxVocab], an
// existing `out` without `force`, an input that is unreadable, empty or not valid UTF-8, or a
// text SentencePiece cannot train the vocabulary on (more pieces than the text holds, or fewer
// than its characters need); before any training starts, except for the last.
void train_tokenizer(const TokenizerTrainOptions& options);

// The 3 special pieces (<unk>, <s>, </s>), the 256 byte pieces of byte fallback, and one more.
inline constexpr int64_t kMinTrainVocab = 260;

}  // namespace mantissa::launcher
