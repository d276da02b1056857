#include "launcher/tokenize/tokenize_train.h"

#include <fcntl.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "core/durable_file.h"
#include "core/error.h"
#include "launcher/tokenize/tokenize_input.h"
#include "launcher/tokenize/tokenize_model.h"
#include "launcher/tokenize/tokenize_shards.h"
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
constexpr size_t kBlockBytes = kMinSampleBytes;
// SentencePiece's default.
constexpr int kTrainThreads = 16;
// Between the lines that show a training is alive (SentencePiece's one call reports nothing).
constexpr auto kProgressInterval = std::chrono::seconds(10);

// The first byte of a character at or after `pos` in valid UTF-8 `text` (or its end).
size_t character_start(std::string_view text, size_t pos) {
  while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
  return pos;
}

class TextBlocks : public sentencepiece::SentenceIterator {
 public:
  // Every block of the files, or, when they hold more than `sample_bytes`, blocks with gaps
  // between them in proportion, so that about sample_bytes are handed out, spread evenly.
  TextBlocks(const std::vector<MappedText>& files, size_t sample_bytes) : files_(files) {
    const size_t total = total_bytes(files);
    if (total > sample_bytes) {
      gap_per_byte_ = static_cast<double>(total - sample_bytes) / static_cast<double>(sample_bytes);
    }
    advance();
  }

  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return block_; }
  sentencepiece::util::Status status() const override { return {}; }
  // Bytes of text handed out so far (read by TrainingProgress's thread too).
  size_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  // Whether the last block has been handed out.
  bool read_all() const { return read_all_.load(std::memory_order_relaxed); }

 private:
  // Passes over the gap owed for the blocks handed out, across files, then on to the start of a
  // line (in a line longer than a block, of a character).
  void skip_gap() {
    while (gap_ >= 1.0 && file_ < files_.size()) {
      const std::string_view text = files_[file_].text();
      const size_t step = std::min(text.size() - pos_, static_cast<size_t>(gap_));
      pos_ += step;
      gap_ -= static_cast<double>(step);
      if (pos_ == text.size()) {
        ++file_;
        pos_ = 0;
        continue;
      }
      const size_t newline = text.substr(pos_, kBlockBytes).find('\n');
      pos_ = newline != std::string_view::npos ? pos_ + newline + 1 : character_start(text, pos_);
    }
  }

  void advance() {
    skip_gap();
    while (file_ < files_.size() && pos_ == files_[file_].text().size()) {
      ++file_;
      pos_ = 0;
    }
    if (file_ == files_.size()) {
      // Last, one space, so that the space symbol, which train_tokenizer requires as a piece,
      // occurs also in text without spaces (BPE training fails on a required character it
      // never saw).
      done_ = space_given_;
      block_.assign(1, ' ');
      space_given_ = true;
      read_all_.store(true, std::memory_order_relaxed);
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
    bytes_.fetch_add(block_.size(), std::memory_order_relaxed);
    gap_ += gap_per_byte_ * static_cast<double>(block_.size());
    pos_ = end;
  }

  const std::vector<MappedText>& files_;
  double gap_per_byte_ = 0.0;  // bytes skipped per byte handed out
  double gap_ = 0.0;           // bytes still to skip before the next block
  size_t file_ = 0;
  size_t pos_ = 0;
  std::atomic<size_t> bytes_ = 0;
  std::atomic<bool> read_all_ = false;
  std::string block_;
  bool space_given_ = false;
  bool done_ = false;
};

// While it lives, a line on stderr every kProgressInterval, so that minutes of training on a
// large sample are not silent: how much of the text SentencePiece has read, then how long it
// has been learning the pieces.
class TrainingProgress {
 public:
  // `sample`: the bytes `blocks` hands out in all (about); `what`: "8192-piece bpe".
  TrainingProgress(const TextBlocks& blocks, size_t sample, std::string what)
      : blocks_(blocks), sample_(sample), what_(std::move(what)), thread_([this] { run(); }) {}
  ~TrainingProgress() {
    {
      const std::lock_guard lock(mutex_);
      stop_ = true;
    }
    stopped_.notify_one();
    thread_.join();
  }
  TrainingProgress(const TrainingProgress&) = delete;
  TrainingProgress& operator=(const TrainingProgress&) = delete;

 private:
  void run() {
    const auto start = std::chrono::steady_clock::now();
    std::unique_lock lock(mutex_);
    while (!stopped_.wait_for(lock, kProgressInterval, [this] { return stop_; })) {
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      const size_t read = blocks_.bytes();
      if (!blocks_.read_all()) {
        std::fprintf(stderr, "mantissa: training a %s tokenizer: read %s of %s (%.0f%%), %.0f s\n",
                     what_.c_str(), format_bytes(static_cast<double>(read)).c_str(),
                     format_bytes(static_cast<double>(sample_)).c_str(),
                     std::min(100.0, 100.0 * static_cast<double>(read) /
                                         static_cast<double>(std::max<size_t>(1, sample_))),
                     seconds);
      } else {
        std::fprintf(stderr,
                     "mantissa: training a %s tokenizer: learning the pieces from %s of text, "
                     "%.0f s\n",
                     what_.c_str(), format_bytes(static_cast<double>(read)).c_str(), seconds);
      }
    }
  }

  const TextBlocks& blocks_;
  const size_t sample_;
  const std::string what_;
  std::mutex mutex_;
  std::condition_variable stopped_;
  bool stop_ = false;
  std::thread thread_;  // last: it starts once the members above exist
};

}  // namespace

void train_tokenizer(const TokenizerTrainOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  if (options.vocab_size > train::kMaxVocab) {
    throw core::ConfigError("--vocab-size " + std::to_string(options.vocab_size) +
                            ": must be at most " + std::to_string(train::kMaxVocab) +
                            " (model.*.vocab_size's bound)");
  }
  if (options.sample_bytes < kMinSampleBytes) {
    throw core::ConfigError("--sample-bytes " + std::to_string(options.sample_bytes) +
                            ": must be at least " + std::to_string(kMinSampleBytes) +
                            " (one block of text)");
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
  if (std::filesystem::exists(std::filesystem::symlink_status(options.out, ec)) && !options.force) {
    throw core::ConfigError("--out '" + options.out + "' exists; --force replaces it");
  }
  const std::filesystem::path parent = std::filesystem::path(options.out).parent_path();
  if (!parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    throw core::ConfigError(
        "--out '" + options.out + "': directory '" + parent.string() +
        (std::filesystem::exists(parent, ec) ? "' is not a directory" : "' does not exist"));
  }
  core::require_can_create_files("--out '" + options.out + "'",
                                 parent.empty() ? "." : parent.string());
  const std::vector<MappedText> files = map_utf8_inputs(options.inputs, {options.out});

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
      // The space symbol is a piece of its own even where the text has too few spaces for it
      // to be kept (Chinese or Japanese text): byte fallback would otherwise encode a space as
      // the symbol's three UTF-8 bytes, which decode to the symbol, not to a space.
      {"required_chars", std::string(kSpaceSymbol)},
      // Runs of spaces (indentation) may become pieces of their own.
      {"allow_whitespace_only_pieces", "true"},
      {"max_sentence_length", std::to_string(kBlockBytes)},
      // A fixed count, not the machine's cores: unigram training sums each thread's share of
      // the expected counts in its own total, so the pieces and scores depend on the count
      // (the OS shares the threads over however many cores there are), and the model records
      // the count.
      {"num_threads", std::to_string(kTrainThreads)},
  };
  sentencepiece::logging::SetMinLogLevel(2);
  TextBlocks blocks(files, static_cast<size_t>(options.sample_bytes));
  std::string model;
  sentencepiece::util::Status status;
  {
    const TrainingProgress progress(
        blocks, std::min(total_bytes(files), static_cast<size_t>(options.sample_bytes)),
        std::to_string(options.vocab_size) + "-piece " + options.model_type);
    status = sentencepiece::SentencePieceTrainer::Train(settings, &blocks, &model);
  }
  // Read for the last time: a text that changed meanwhile, not the text, is what failed.
  for (const MappedText& file : files) require_unchanged_input(file);
  if (!status.ok()) {
    std::string reason = sentencepiece_reason(status.error_message());
    // "Vocabulary size is smaller than required_chars. 260 vs 335. Increase vocab_size or
    // decrease character_coverage with --character_coverage option." names an option this
    // command does not have: say what the number means instead.
    long long have = 0, need = 0;
    if (std::sscanf(reason.c_str(), "Vocabulary size is smaller than required_chars. %lld vs %lld",
                    &have, &need) == 2) {
      reason = "it needs at least " + std::to_string(need) +
               " pieces (3 special, 256 bytes, SentencePiece's space mark U+2581 and one per "
               "other character making up 99.95% of the text): " +
               (need <= train::kMaxVocab
                    ? "raise --vocab-size"
                    : "the text has too many different characters for the " +
                          std::to_string(train::kMaxVocab) + " pieces a model may have");
    }
    throw core::ConfigError("cannot train a " + std::to_string(options.vocab_size) + "-piece " +
                            options.model_type + " tokenizer on this text: " + reason);
  }
  // The model must be what encode accepts; this cannot fail with the settings above.
  const Tokenizer tokenizer(options.out, model);
  core::remove_orphaned_temporaries_of(options.out);  // an earlier training's, killed
  // Without --force, checked free before the training: never replaced if filled since.
  core::write_file_atomically(options.out, model,
                              options.force ? core::AtPath::kReplace : core::AtPath::kKeep);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const size_t bytes = total_bytes(files);
  const std::string sampled =
      blocks.bytes() < bytes ? " sampled evenly from " + format_bytes(bytes) : "";
  std::fprintf(stderr,
               "mantissa: wrote %s: a %d-piece %s tokenizer, trained on %s%s of text in %.1f s on "
               "%d core%s\n",
               options.out.c_str(), tokenizer.vocab_size(), options.model_type.c_str(),
               format_bytes(blocks.bytes()).c_str(), sampled.c_str(), seconds, usable_cores(),
               usable_cores() == 1 ? "" : "s");
}

}  // namespace mantissa::launcher
