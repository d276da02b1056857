// `mantissa tokenize info|ids|text`: a tokenizer for another process, over its standard input
// and output. `mantissa sample` cannot link SentencePiece (launcher/tokenize/tokenize.h), so it
// runs mantissa-tokenize with these to turn its prompt into token ids and the generated ids into
// text (launcher/tokenize/tokenize_client.h).
#pragma once

#include <cstdio>
#include <string>

namespace mantissa::launcher {

// Writes "vocab_size N\neot E\n": the tokenizer's piece count and its end-of-text id.
void print_tokenizer_info(const std::string& tokenizer_path, std::FILE* out);

// Reads UTF-8 text from `in` to its end and writes its token ids to `out`, decimal, separated
// by spaces, then a newline (an empty line for no text). Throws core::ConfigError for text
// that is not valid UTF-8 (with the byte offset) and for a tokenizer Tokenizer refuses.
void text_to_ids(const std::string& tokenizer_path, std::FILE* in, std::FILE* out);

// Reads token ids (decimal, separated by white space) from `in` to its end and writes their
// text to `out`, exactly (end-of-text ids give nothing). Throws core::ConfigError for
// anything that is not an id of the tokenizer, naming it.
void ids_to_text(const std::string& tokenizer_path, std::FILE* in, std::FILE* out);

}  // namespace mantissa::launcher
