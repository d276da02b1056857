// `mantissa tokenize decode`: the text of llm.c token shards.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace mantissa::launcher {

// Writes the text of the shards `inputs`, read in the order given as one token stream, to
// `out`; end-of-text tokens give nothing, so the shards of `mantissa tokenize encode` give back
// its input files, concatenated. Throws core::ConfigError for a tokenizer Tokenizer refuses or
// a shard the reader refuses (missing, malformed, a token id outside the vocabulary),
// core::Error when `out` cannot be written.
void decode_shards(const std::string& tokenizer_path, const std::vector<std::string>& inputs,
                   std::FILE* out);

}  // namespace mantissa::launcher
