#include "launcher/tokenize/tokenize_model.h"

#include <sentencepiece_processor.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>

#include "core/error.h"
#include "core/read_file.h"
#include "train/data/corpus.h"

namespace mantissa::launcher {

namespace {

using std::string_view_literals::operator""sv;

// What an exact tokenizer must give back unchanged: leading, doubled and trailing spaces (which
// the default normalisation removes), tabs, blank lines and CR LF, NFKC-sensitive characters
// (the ligature "ﬁ", the full-width "Ａ"), accents, CJK, an emoji (outside any small
// vocabulary: byte fallback), a literal U+2581 and a NUL.
constexpr std::string_view kProbe =
    " two  spaces,\ta tab\n\nCR LF\r\n\xEF\xAC\x81 \xEF\xBC\xA1 caf\xC3\xA9 "
    "\xE4\xB8\xAD\xE6\x96\x87 "
    "\xF0\x9F\x98\x80 \xE2\x96\x81 \0 end "sv;

// Far above any SentencePiece model (a vocabulary of 256k pieces takes about 5 MB) and below
// the 2 GiB protobuf parses at all: a larger file is another kind of file (a shard, a
// safetensors file), refused before it is read into memory.
constexpr uintmax_t kMaxModelBytes = uintmax_t{256} << 20;

std::string read_model_file(const std::string& path) {
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (!ec && size > kMaxModelBytes) {
    throw core::ConfigError("tokenizer '" + path + "' is " + std::to_string(size) +
                            " bytes, more than the " + std::to_string(kMaxModelBytes >> 20) +
                            " MiB a SentencePiece model may be (not a tokenizer model?)");
  }
  std::string bytes = core::read_whole_file(path, "tokenizer");
  if (bytes.empty()) throw core::ConfigError("tokenizer '" + path + "' is empty");
  return bytes;
}

}  // namespace

std::string sentencepiece_reason(std::string_view message) {
  const size_t bracket = message.rfind("] ");
  if (bracket != std::string_view::npos) message.remove_prefix(bracket + 2);
  while (!message.empty() && message.back() == ' ') message.remove_suffix(1);
  return std::string(message);
}

Tokenizer::Tokenizer(const std::string& path) : Tokenizer(path, read_model_file(path)) {}

Tokenizer::Tokenizer(const std::string& path, std::string model_bytes)
    : path_(path),
      model_bytes_(std::move(model_bytes)),
      processor_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const sentencepiece::util::Status status = processor_->LoadFromSerializedProto(model_bytes_);
  if (!status.ok()) {
    const std::string reason = sentencepiece_reason(status.error_message());
    // A reason comes from a model that parses but breaks SentencePiece's rules: one cut short
    // or damaged, most likely.
    throw core::ConfigError("tokenizer '" + path_ + "' is not a SentencePiece model" +
                            (reason.empty() ? " (it does not parse as one)"
                                            : ": " + reason + " (damaged or truncated?)"));
  }
  vocab_size_ = processor_->GetPieceSize();
  if (vocab_size_ > train::kMaxVocab) {
    throw core::ConfigError("tokenizer '" + path_ + "' has " + std::to_string(vocab_size_) +
                            " pieces, more than the " + std::to_string(train::kMaxVocab) +
                            " a model may have");
  }
  const int eos = processor_->eos_id();
  if (eos < 0) {
    throw core::ConfigError("tokenizer '" + path_ +
                            "' has no end-of-text piece (</s>) to separate documents");
  }
  eot_ = static_cast<uint32_t>(eos);

  continuation_.assign(vocab_size_, false);
  for (int id = 0; id < vocab_size_; ++id) {
    if (id != eos && (processor_->IsUnknown(id) || processor_->IsControl(id))) {
      never_encoded_.push_back(static_cast<uint32_t>(id));
    }
    unsigned byte = 0;
    if (processor_->IsByte(id) &&
        std::sscanf(processor_->IdToPiece(id).c_str(), "<0x%2X>", &byte) == 1) {
      continuation_[id] = byte >= 0x80 && byte <= 0xBF;
    }
  }
  for (const char c : kSpaceSymbol) {
    char piece[8];
    std::snprintf(piece, sizeof piece, "<0x%02X>", static_cast<unsigned char>(c));
    space_symbol_bytes_.push_back(static_cast<uint32_t>(processor_->PieceToId(piece)));
  }

  std::vector<uint32_t> tokens;
  encode(kProbe, tokens);
  if (decode(tokens) != kProbe) {
    throw core::ConfigError(
        "tokenizer '" + path_ +
        "' does not give text back exactly (it normalises text or has no byte fallback); train "
        "one with `mantissa tokenize train`");
  }
}

Tokenizer::~Tokenizer() = default;

void Tokenizer::encode(std::string_view text, std::vector<uint32_t>& out) const {
  // A U+2581 of the text itself would come back as a space, so it is encoded as its three byte
  // tokens (byte fallback's own pieces), which decode to those bytes; the text between is
  // encoded as usual.
  std::vector<int> ids;
  while (!text.empty()) {
    const size_t at = text.find(kSpaceSymbol);
    const std::string_view part = text.substr(0, at);
    if (!part.empty()) {
      const sentencepiece::util::Status status = processor_->Encode(part, &ids);
      MANTISSA_CHECK(status.ok(),
                     "tokenizer '" << path_ << "': encoding failed: " << status.ToString());
      out.insert(out.end(), ids.begin(), ids.end());
    }
    if (at == std::string_view::npos) break;
    out.insert(out.end(), space_symbol_bytes_.begin(), space_symbol_bytes_.end());
    text.remove_prefix(at + kSpaceSymbol.size());
  }
}

std::string Tokenizer::decode(std::span<const uint32_t> tokens) const {
  const std::vector<int> ids(tokens.begin(), tokens.end());
  std::string text;
  const sentencepiece::util::Status status = processor_->Decode(ids, &text);
  MANTISSA_CHECK(status.ok(),
                 "tokenizer '" << path_ << "': decoding failed: " << status.ToString());
  return text;
}

}  // namespace mantissa::launcher
