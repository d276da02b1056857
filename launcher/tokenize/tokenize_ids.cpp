#include "launcher/tokenize/tokenize_ids.h"

#include <cerrno>
#include <charconv>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "launcher/tokenize/tokenize_encode.h"
#include "launcher/tokenize/tokenize_input.h"
#include "launcher/tokenize/tokenize_model.h"

namespace mantissa::launcher {

namespace {

std::string read_all(std::FILE* in) {
  std::string data;
  char buffer[1 << 16];
  size_t n = 0;
  while ((n = std::fread(buffer, 1, sizeof buffer, in)) > 0) data.append(buffer, n);
  MANTISSA_REQUIRE(!std::ferror(in), kFailure,
                   "cannot read standard input: " << std::strerror(errno));
  return data;
}

void write_all(std::FILE* out, const std::string& data) {
  MANTISSA_REQUIRE(
      std::fwrite(data.data(), 1, data.size(), out) == data.size() && std::fflush(out) == 0,
      kFailure, "cannot write standard output: " << std::strerror(errno));
}

}  // namespace

void print_tokenizer_info(const std::string& tokenizer_path, std::FILE* out) {
  const Tokenizer tokenizer(tokenizer_path);
  std::string info = "vocab_size " + std::to_string(tokenizer.vocab_size()) + "\neot " +
                     std::to_string(tokenizer.eot()) + "\nnever_encoded";
  for (const uint32_t id : tokenizer.never_encoded()) {
    info.push_back(' ');
    info.append(std::to_string(id));
  }
  write_all(out, info + "\n");
}

void text_to_ids(const std::string& tokenizer_path, std::FILE* in, std::FILE* out) {
  const Tokenizer tokenizer(tokenizer_path);
  const std::string text = read_all(in);
  const size_t invalid = first_invalid_utf8(text);
  if (invalid != text.size()) {
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[invalid]));
    throw core::ConfigError(std::string("the text is not valid UTF-8: byte ") + byte +
                            " at offset " + std::to_string(invalid));
  }
  std::vector<uint32_t> ids;
  encode_as_shards(tokenizer, text, ids);
  std::string line;
  for (const uint32_t id : ids) {
    if (!line.empty()) line.push_back(' ');
    line.append(std::to_string(id));
  }
  line.push_back('\n');
  write_all(out, line);
}

void ids_to_text(const std::string& tokenizer_path, std::FILE* in, std::FILE* out) {
  const Tokenizer tokenizer(tokenizer_path);
  const std::string data = read_all(in);
  std::vector<uint32_t> ids;
  size_t at = 0;
  while (true) {
    at = data.find_first_not_of(" \t\r\n", at);
    if (at == std::string::npos) break;
    const size_t end = std::min(data.find_first_of(" \t\r\n", at), data.size());
    const std::string_view word(data.data() + at, end - at);
    int64_t id = -1;
    const auto [stop, ec] = std::from_chars(word.data(), word.data() + word.size(), id);
    if (ec != std::errc() || stop != word.data() + word.size() || id < 0 ||
        id >= tokenizer.vocab_size()) {
      throw core::ConfigError("'" + std::string(word.substr(0, 40)) + "' is not a token id of '" +
                              tokenizer_path + "' (0.." +
                              std::to_string(tokenizer.vocab_size() - 1) + ")");
    }
    ids.push_back(static_cast<uint32_t>(id));
    at = end;
  }
  write_all(out, tokenizer.decode(ids));
}

}  // namespace mantissa::launcher
