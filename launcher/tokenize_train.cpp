#include "launcher/tokenize_train.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <unordered_map>

#include "core/error.h"
#include "launcher/tokenize_input.h"
#include "launcher/tokenize_model.h"
#include "launcher/tokenize_shards.h"
#include "train/data/corpus.h"

// Declared in SentencePiece's internal common.h, exported by libsentencepiece: 0 logs
// everything (the trainer's INFO lines run to hundreds), 2 errors only (its warnings say
// again, in its own words, what the error this reports says).
namespace sentencepiece::logging {
void SetMinLogLevel(int level);
}  // namespace sentencepiece::logging

namespace mantissa::launcher {

namespace {

// SentencePiece trains on "sentences" of at most max_sentence_length bytes (it skips longer
// ones). It gets blocks of whole lines, each line with its newline, so that it can learn pieces
// such as "\n\n" or ".\n"; a line longer than a block is cut at character boundaries.
constexpr size_t kBlockBytes = 4096;

class TextBlocks : public sentencepiece::SentenceIterator {
 public:
  explicit TextBlocks(const std::vector<MappedText>& files) : files_(files) { advance(); }

  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return block_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  void advance() {
    while (file_ < files_.size() && pos_ == files_[file_].text().size()) {
      ++file_;
      pos_ = 0;
    }
    if (file_ == files_.size()) {
      done_ = true;
      return;
    }
    const std::string_view text = files_[file_].text();
    size_t end = text.size();
    if (end - pos_ > kBlockBytes) {
      const size_t newline = text.rfind('\n', pos_ + kBlockBytes - 1);
      if (newline != std::string_view::npos && newline >= pos_) {
        end = newline + 1;
      } else {
        end = pos_ + kBlockBytes;
        while ((static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
      }
    }
    block_.assign(text.substr(pos_, end - pos_));
    pos_ = end;
  }

  const std::vector<MappedText>& files_;
  size_t file_ = 0;
  size_t pos_ = 0;
  std::string block_;
  bool done_ = false;
};

}  // namespace

void train_tokenizer(const TokenizerTrainOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.vocab_size > train::kMaxVocab) {
    throw core::ConfigError("--vocab-size " + std::to_string(options.vocab_size) +
                            ": must be at most " + std::to_string(train::kMaxVocab) +
                            " (model.*.vocab_size's bound)");
  }
  if (options.vocab_size < kMinTrainVocab) {
    throw core::ConfigError("--vocab-size " + std::to_string(options.vocab_size) +
                            ": must be at least " + std::to_string(kMinTrainVocab) +
                            " (3 special and 256 byte pieces come first)");
  }
  std::error_code ec;
  if (std::filesystem::is_directory(options.out, ec)) {
    throw core::ConfigError("--out '" + options.out + "' is a directory");
  }
  if (std::filesystem::exists(options.out, ec) && !options.force) {
    throw core::ConfigError("--out '" + options.out + "' exists; --force replaces it");
  }
  const std::filesystem::path parent = std::filesystem::path(options.out).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    throw core::ConfigError("--out '" + options.out + "': directory '" + parent.string() +
                            "' does not exist");
  }
  std::vector<MappedText> files;
  size_t bytes = 0;
  for (const std::string& path : options.inputs) {
    files.emplace_back(path);
    const std::string_view text = files.back().text();
    const size_t bad = first_invalid_utf8(text);
    if (bad != text.size()) throw_invalid_utf8(path, text, bad);
    bytes += text.size();
  }

  const std::unordered_map<std::string, std::string> settings = {
      {"model_type", options.model_type},
      {"vocab_size", std::to_string(options.vocab_size)},
      // Exact decoding: no normalisation at all (the default NFKC rule folds characters and
      // remove_extra_whitespaces drops leading, trailing and doubled spaces), no space added in
      // front of the text, and byte fallback, so that a character outside the vocabulary
      // becomes its UTF-8 bytes instead of <unk>.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      {"byte_fallback", "true"},
      // Runs of spaces (indentation) may become pieces of their own.
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentence_length", std::to_string(kBlockBytes)},
      {"num_threads", std::to_string(usable_cores())},
  };
  sentencepiece::logging::SetMinLogLevel(2);
  TextBlocks blocks(files);
  std::string model;
  const sentencepiece::util::Status status =
      sentencepiece::SentencePieceTrainer::Train(settings, &blocks, &model);
  if (!status.ok()) {
    // "Internal: ./src/trainer_interface.cc(660) [(condition)] What went wrong." keeps only
    // what went wrong.
    std::string reason = status.error_message();
    const size_t bracket = reason.rfind("] ");
    if (bracket != std::string::npos) reason.erase(0, bracket + 2);
    throw core::ConfigError("cannot train a " + std::to_string(options.vocab_size) + "-piece " +
                            options.model_type + " tokenizer on this text: " + reason);
  }
  // The model must be what encode accepts; this cannot fail with the settings above.
  const Tokenizer tokenizer(options.out, model);
  write_file_atomically(options.out, model);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::fprintf(
      stderr,
      "mantissa: wrote %s: a %d-piece %s tokenizer, trained on %s of text in %.1f s on %d cores\n",
      options.out.c_str(), tokenizer.vocab_size(), options.model_type.c_str(),
      format_bytes(bytes).c_str(), seconds, usable_cores());
}

}  // namespace mantissa::launcher
