// `mantissa tokenize encode`: UTF-8 text files to llm.c token shards, on every core.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "launcher/tokenize/tokenize_model.h"

namespace mantissa::launcher {

inline constexpr double kDefaultValFraction = 0.1;
// llm.c's fineweb.py writes shards of 10^8 tokens (200 MB).
inline constexpr int64_t kDefaultShardTokens = 100'000'000;

struct EncodeOptions {
  std::string tokenizer;
  std::vector<std::string> inputs;
  std::string out_dir;
  double val_fraction = kDefaultValFraction;
  int64_t shard_tokens = kDefaultShardTokens;
  bool force = false;  // replace the shards and tokenizer.model out_dir holds
};

// Encodes the inputs, in order, as one token stream: each file is one document, preceded by
// the end-of-text token (llm.c's convention). The last val_fraction of the stream goes to
// out_dir/val_NNNNNN.bin, the rest to out_dir/train_NNNNNN.bin, shards of at most
// shard_tokens tokens; the tokenizer is copied to out_dir/tokenizer.model. The tokens do not
// depend on the number of threads. Progress goes to stderr every few seconds.
// Throws core::ConfigError for bad options, a tokenizer Tokenizer refuses, an input that is
// unreadable, empty or not valid UTF-8 (naming the file and the byte offset), or an output
// directory that holds shards without `force`; nothing is left behind then. SIGINT, SIGTERM or
// SIGHUP before the files are moved into place throws Interrupted (core/interrupt.h), again
// leaving nothing behind.
void encode_to_shards(const EncodeOptions& options);

// The tokens encode_to_shards writes for one file's `text` (without the end-of-text token
// before it), appended to `out`: the text in the same chunks and pieces, whose ends depend on
// the text alone, so memory stays that of a 4 KiB piece however long the text.
void encode_as_shards(const Tokenizer& tokenizer, std::string_view text,
                      std::vector<uint32_t>& out);

}  // namespace mantissa::launcher
