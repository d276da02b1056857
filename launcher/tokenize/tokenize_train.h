// `mantissa tokenize train`: a SentencePiece model trained on UTF-8 text files, with the
// settings that make decoding exact.
#pragma once

#include <string>
#include <vector>

namespace mantissa::launcher {

// SentencePiece holds the text it trains on in memory many times over: 20-25 bytes per byte of
// text, measured for BPE and unigram on 11-20 MB of Python sources and of random words. 256 MiB
// of text then needs about 6 GB.
inline constexpr int64_t kDefaultSampleBytes = int64_t{1} << 28;

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;
  int64_t vocab_size = 0;
  std::string model_type = "bpe";  // or "unigram"
  std::string out;
  bool force = false;  // replace an existing `out`
  // Text beyond this is sampled: blocks of whole lines spread evenly over the inputs, about
  // sample_bytes in all, the same blocks on every run.
  int64_t sample_bytes = kDefaultSampleBytes;
};

// Trains on every input file and writes the model to options.out (through a temporary file).
// Throws core::ConfigError for a vocabulary size outside [kMinTrainVocab, train::kMaxVocab], a
// sample_bytes below kMinSampleBytes, an
// existing `out` without `force`, an input that is unreadable, empty or not valid UTF-8, or a
// text SentencePiece cannot train the vocabulary on (more pieces than the text holds, or fewer
// than its characters need); before any training starts, except for the last.
void train_tokenizer(const TokenizerTrainOptions& options);

// The 3 special pieces (<unk>, <s>, </s>), the 256 byte pieces of byte fallback, and one more.
inline constexpr int64_t kMinTrainVocab = 260;
// One block of text (the longest "sentence" SentencePiece is given).
inline constexpr int64_t kMinSampleBytes = 4096;

}  // namespace mantissa::launcher
