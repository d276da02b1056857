// The pieces of `mantissa tokenize` (launcher/tokenize/): the UTF-8 check, exact encoding
// (a literal U+2581 included), where shards may be cut, and which models are refused.
// tests/launcher/test_tokenize.py runs the executables end to end.
#include <glob.h>
#include <gtest/gtest.h>
#include <sentencepiece_trainer.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/error.h"
#include "launcher/tokenize/tokenize_input.h"
#include "launcher/tokenize/tokenize_model.h"
#include "launcher/tokenize/tokenize_shards.h"
#include "launcher/tokenize/tokenize_train.h"
#include "train/data/corpus.h"

namespace mantissa::launcher {
namespace {

namespace fs = std::filesystem;
using std::string_view_literals::operator""sv;

TEST(Utf8, ValidTextHasNoInvalidByte) {
  for (const std::string_view text :
       {""sv, "plain ASCII, longer than eight bytes"sv, "caf\xC3\xA9"sv,
        "\xE4\xB8\xAD\xE6\x96\x87 and \xF0\x9F\x98\x80"sv, "\xF4\x8F\xBF\xBF"sv, "a\0b"sv}) {
    EXPECT_EQ(first_invalid_utf8(text), text.size()) << text;
  }
}

TEST(Utf8, FindsTheStartOfTheFirstInvalidSequence) {
  struct Case {
    std::string_view text;
    size_t offset;
  };
  for (const Case& c :
       {Case{"0123456789abcdefghij\xFF"sv, 20},      // after the eight-byte ASCII path
        Case{"ab\xC0\x80"sv, 2},                     // overlong NUL
        Case{"\xE0\x80\x80"sv, 0},                   // overlong 3-byte form
        Case{"x\xED\xA0\x80"sv, 1},                  // a surrogate, U+D800
        Case{"\xF4\x90\x80\x80"sv, 0},               // above U+10FFFF
        Case{"\xF5\x80\x80\x80"sv, 0},               // no such lead byte
        Case{"ok \xE2\x96"sv, 3},                    // cut short at the end
        Case{"\xC3\xA9\xE2\x41\x41"sv, 2},           // a bad continuation byte
        Case{"\x80"sv, 0},                           // a continuation byte alone
        Case{"\xF0\x9F\x98\x80\xF0\x9F\x98"sv, 4}})  // the second emoji is cut short
  {
    EXPECT_EQ(first_invalid_utf8(c.text), c.offset) << c.text;
  }
}

// Lines with accents, CJK and emoji, so that a small vocabulary leaves some characters to
// byte fallback.
std::string sample_text() {
  std::string text;
  for (int i = 0; i < 400; ++i) {
    text += "Line " + std::to_string(i) +
            ": the caf\xC3\xA9 serves cr\xC3\xAA"
            "pes;  indented\t";
    text +=
        i % 7 == 0 ? "\xE4\xB8\xAD\xE6\x96\x87\xE6\x96\x87\xE5\xAD\x97 \xF0\x9F\x98\x80\n" : "\n";
    if (i % 10 == 0) text += "\n";
  }
  return text;
}

class TokenizerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(fs::path(::testing::TempDir()) / "mantissa_test_tokenize");
    fs::remove_all(*dir_);
    fs::create_directories(*dir_);
    std::ofstream(*dir_ / "text.txt", std::ios::binary) << sample_text();
    train_tokenizer(
        {{(*dir_ / "text.txt").string()}, 300, "bpe", (*dir_ / "tok.model").string(), false});
    tokenizer_ = new Tokenizer((*dir_ / "tok.model").string());
  }
  static void TearDownTestSuite() {
    delete tokenizer_;
    fs::remove_all(*dir_);
    delete dir_;
  }
  static fs::path* dir_;
  static Tokenizer* tokenizer_;
};
fs::path* TokenizerTest::dir_ = nullptr;
Tokenizer* TokenizerTest::tokenizer_ = nullptr;

std::string decode(const Tokenizer& tokenizer, std::span<const uint32_t> tokens) {
  return tokenizer.decode(tokens);
}

// `tokens` as the stream the shard planner cuts.
train::TokenSegment stream_of(const std::vector<uint32_t>& tokens) {
  return {"stream", tokens};
}

TEST_F(TokenizerTest, IdsFollowSentencePiecesLayout) {
  EXPECT_EQ(tokenizer_->vocab_size(), 300);
  EXPECT_EQ(tokenizer_->eot(), 2);
  // <unk> and <s>, which text never encodes to (sample never draws them); </s> is eot.
  EXPECT_EQ(tokenizer_->never_encoded(), (std::vector<uint32_t>{0, 1}));
  // Byte 0xNN is id 3 + 0xNN: a lead byte may start a shard, a continuation byte may not.
  EXPECT_TRUE(tokenizer_->can_start_at(3 + 0xE2));
  EXPECT_FALSE(tokenizer_->can_start_at(3 + 0x96));
  EXPECT_TRUE(tokenizer_->can_start_at(3 + 0xC0));
  EXPECT_FALSE(tokenizer_->can_start_at(3 + 0xBF));
}

TEST_F(TokenizerTest, DecodingGivesTheTextBackExactly) {
  const std::string sample = sample_text();
  for (const std::string_view text :
       {std::string_view(sample), "  leading and doubled  spaces, trailing  "sv,
        "\n\n\r\n\ttabs\xEF\xAC\x81\xEF\xBC\xA1"sv, "\xF0\x9F\xA6\x80 an emoji never seen"sv,
        "\xE2\x96\x81\xE2\x96\x81 U+2581 itself, \xE2\x96\x81 twice and at the end\xE2\x96\x81"sv,
        "nul \0 inside"sv}) {
    std::vector<uint32_t> tokens;
    tokenizer_->encode(text, tokens);
    EXPECT_EQ(decode(*tokenizer_, tokens), text);
  }
}

TEST_F(TokenizerTest, TheSpaceSymbolItselfBecomesItsBytes) {
  std::vector<uint32_t> tokens;
  tokenizer_->encode("\xE2\x96\x81", tokens);
  EXPECT_EQ(tokens, (std::vector<uint32_t>{3 + 0xE2, 3 + 0x96, 3 + 0x81}));
}

TEST_F(TokenizerTest, ShardsNeverCutACharactersBytes) {
  // Emoji outside the vocabulary: four byte tokens each.
  std::string text;
  for (int i = 0; i < 50; ++i) text += "\xF0\x9F\xA6\x80 x\xF0\x9F\xA6\x81";
  std::vector<uint32_t> tokens;
  tokenizer_->encode(text, tokens);
  for (size_t max_tokens = 4; max_tokens <= 9; ++max_tokens) {
    const auto shards = plan_shards(*tokenizer_, stream_of(tokens), max_tokens);
    std::string joined;
    size_t expected_begin = 0;
    for (const auto& [begin, end] : shards) {
      ASSERT_EQ(begin, expected_begin);
      ASSERT_GT(end, begin);
      ASSERT_LE(end - begin, max_tokens);
      const std::string piece =
          decode(*tokenizer_, std::span<const uint32_t>(tokens).subspan(begin, end - begin));
      ASSERT_EQ(first_invalid_utf8(piece), piece.size())
          << "shard [" << begin << ", " << end << ") with max " << max_tokens;
      joined += piece;
      expected_begin = end;
    }
    EXPECT_EQ(expected_begin, tokens.size());
    EXPECT_EQ(joined, text);
  }
  EXPECT_TRUE(plan_shards(*tokenizer_, stream_of({}), 4).empty());
}

TEST_F(TokenizerTest, StartAtOrBeforeStepsBackToALeadByte) {
  std::vector<uint32_t> tokens;
  tokenizer_->encode("a\xF0\x9F\xA6\x80", tokens);
  ASSERT_EQ(tokens.size(), 5u);
  EXPECT_EQ(start_at_or_before(*tokenizer_, stream_of(tokens), 4), 1);
  EXPECT_EQ(start_at_or_before(*tokenizer_, stream_of(tokens), 1), 1);
  EXPECT_EQ(start_at_or_before(*tokenizer_, stream_of(tokens), 5), 5);
  EXPECT_EQ(start_at_or_before(*tokenizer_, stream_of(tokens), 99), 5);
  EXPECT_EQ(start_at_or_before(*tokenizer_, stream_of(tokens), 0), 0);
}

// The stream spilled in a width, cut into shards by the writer of `mantissa tokenize encode`,
// read back by the reader training uses.
std::vector<int32_t> spill_and_write(const fs::path& dir, int token_bytes,
                                     const std::vector<uint32_t>& tokens, int32_t* magic) {
  fs::remove_all(dir);
  StagedOutput out(dir.string(), false);
  TokenSpill spill(dir.string(), token_bytes);
  spill.append(std::span(tokens).first(2));
  spill.append(std::span(tokens).subspan(2));
  const train::TokenSegment stream = spill.map();
  EXPECT_EQ(stream.size(), static_cast<int64_t>(tokens.size()));
  out.write_shard("train_000000.bin", stream.subspan(1, stream.size() - 1));
  out.commit();
  std::ifstream(dir / "train_000000.bin", std::ios::binary)
      .read(reinterpret_cast<char*>(magic), sizeof *magic);
  const train::Corpus corpus =
      train::Corpus::token_shards((dir / "train_*.bin").string(), train::kMaxVocab);
  std::vector<int32_t> read(static_cast<size_t>(corpus.num_tokens()));
  corpus.segments()[0].read(0, read, corpus.vocab_size());
  return read;
}

TEST(TokenSpill, WritesGpt2ShardsForSmallVocabulariesAndLlama3ShardsBeyond) {
  EXPECT_EQ(train::shard_token_bytes(65536), 2);
  EXPECT_EQ(train::shard_token_bytes(65537), 4);
  const fs::path dir = fs::path(::testing::TempDir()) / "mantissa_test_token_spill";
  int32_t magic = 0;
  EXPECT_EQ(spill_and_write(dir, 2, {2, 65535, 7, 0}, &magic), (std::vector<int32_t>{65535, 7, 0}));
  EXPECT_EQ(magic, train::kShardMagic);
  EXPECT_EQ(spill_and_write(dir, 4, {2, 1048575, 65536, 3}, &magic),
            (std::vector<int32_t>{1048575, 65536, 3}));
  EXPECT_EQ(magic, train::kLlama3ShardMagic);
  // The spill never had a name in the directory: only the shard is there.
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"train_000000.bin"});
  fs::remove_all(dir);
}

std::vector<std::string> glob_names(const fs::path& pattern) {
  glob_t matches{};
  std::vector<std::string> names;
  if (glob(pattern.c_str(), 0, nullptr, &matches) == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) {
      names.push_back(fs::path(matches.gl_pathv[i]).filename().string());
    }
  }
  globfree(&matches);
  return names;
}

// Until the commit a shard lies under a hidden name, which no training pattern matches: an
// encode killed before its commit (SIGKILL: no destructor runs) leaves nothing a loose pattern
// such as DIR/train_* or DIR/* would train on.
TEST(StagedOutput, StagedShardsMatchNoTrainingPatternUntilTheCommit) {
  const fs::path dir = fs::path(::testing::TempDir()) / "mantissa_test_staged_output";
  fs::remove_all(dir);
  StagedOutput out(dir.string(), false);
  TokenSpill spill(dir.string(), 2);
  const std::vector<uint32_t> tokens = {1, 2, 3, 4};
  spill.append(tokens);
  out.write_shard("train_000000.bin", spill.map());
  out.write_file("tokenizer.model", "model");
  for (const char* pattern : {"train_*", "*", "*.tmp"}) {
    EXPECT_EQ(glob_names(dir / pattern), std::vector<std::string>{}) << pattern;
  }
  EXPECT_TRUE(fs::exists(dir / ".train_000000.bin.tmp"));
  out.commit();
  EXPECT_EQ(glob_names(dir / "train_*"), std::vector<std::string>{"train_000000.bin"});
  EXPECT_EQ(glob_names(dir / "*"),
            (std::vector<std::string>{"tokenizer.model", "train_000000.bin"}));
  fs::remove_all(dir);
}

void expect_config_error(const std::function<void()>& run, const std::string& part) {
  try {
    run();
    ADD_FAILURE() << "no error; expected one containing: " << part;
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST_F(TokenizerTest, RefusesModelsThatDoNotDecodeExactly) {
  // SentencePiece's defaults: NFKC, whitespace folding, a dummy prefix, no byte fallback.
  std::string model;
  const sentencepiece::util::Status status = sentencepiece::SentencePieceTrainer::Train(
      std::unordered_map<std::string, std::string>{
          {"input", (*dir_ / "text.txt").string()}, {"vocab_size", "200"}, {"model_type", "bpe"}},
      nullptr, &model);
  ASSERT_TRUE(status.ok()) << status.ToString();
  expect_config_error([&] { Tokenizer("default.model", model); },
                      "tokenizer 'default.model' does not give text back exactly");
  expect_config_error([&] { Tokenizer("junk.model", "not a model"); },
                      "tokenizer 'junk.model' is not a SentencePiece model (it does not parse "
                      "as one)");
  expect_config_error([&] { Tokenizer((*dir_ / "missing.model").string()); },
                      "missing.model': cannot open: No such file or directory");
  expect_config_error([&] { Tokenizer(dir_->string()); }, "': is a directory, not a file");
  const std::string empty = (*dir_ / "empty.model").string();
  std::ofstream{empty};
  expect_config_error([&] { Tokenizer{empty}; }, "tokenizer '" + empty + "' is empty");
  // A read that fails (a regular file of /proc that refuses it) says why, as a failure a
  // retry may get past (an I/O error), not the user's to fix.
  try {
    Tokenizer{"/proc/self/mem"};
    ADD_FAILURE() << "reading /proc/self/mem as a tokenizer did not fail";
  } catch (const core::Error& e) {
    EXPECT_EQ(e.kind(), core::ErrorKind::kFailure) << e.what();
    EXPECT_EQ(std::string(e.what()), "tokenizer '/proc/self/mem': read failed: Input/output error");
  }
}

TEST(SentencepieceReason, KeepsWhatWentWrongWithoutTheSourceLocation) {
  EXPECT_EQ(
      sentencepiece_reason("Internal: ./src/trainer_interface.cc(660) [(a) <= (b)] Vocabulary "
                           "size too high (300). Please set it to a value <= 261."),
      "Vocabulary size too high (300). Please set it to a value <= 261.");
  EXPECT_EQ(sentencepiece_reason("Internal: ./src/sentencepiece_processor.cc(232) "
                                 "[model_proto->ParseFromArray(serialized.data(), "
                                 "serialized.size())] "),
            "");
  EXPECT_EQ(sentencepiece_reason("Not found: unknown field name"), "Not found: unknown field name");
}

TEST(FormatBytes, NamesTheUnit) {
  EXPECT_EQ(format_bytes(1), "1 byte");
  EXPECT_EQ(format_bytes(999), "999 bytes");
  EXPECT_EQ(format_bytes(35100), "35.1 kB");
  EXPECT_EQ(format_bytes(1.2e9), "1.2 GB");
}

TEST(MappedText, RefusesMissingEmptyAndNonRegularFiles) {
  const fs::path dir = fs::path(::testing::TempDir()) / "mantissa_test_mapped_text";
  fs::create_directories(dir);
  std::ofstream(dir / "empty.txt").close();
  expect_config_error(
      [&] { MappedText((dir / "none.txt").string()); },
      "cannot read input '" + (dir / "none.txt").string() + "': No such file or directory");
  expect_config_error([&] { MappedText((dir / "empty.txt").string()); },
                      "input '" + (dir / "empty.txt").string() + "' is empty");
  expect_config_error([&] { MappedText(dir.string()); }, "is not a regular file");
  fs::remove_all(dir);
}

TEST(MappedText, SeesAFileAppendedToOrRewrittenInPlaceButNotOneReplaced) {
  const fs::path dir = fs::path(::testing::TempDir()) / "mantissa_test_mapped_text_change";
  fs::create_directories(dir);
  const fs::path path = dir / "corpus.txt";
  std::ofstream(path) << "first line\n";
  const std::vector<MappedText> files = [&] {
    std::vector<MappedText> mapped;
    mapped.emplace_back(path.string());
    return mapped;
  }();
  EXPECT_EQ(files[0].change_since_mapped(), "");
  require_unchanged_input(files[0]);

  std::ofstream(path, std::ios::app) << "second line\n";
  EXPECT_EQ(files[0].change_since_mapped(), "it holds 23 bytes now, 11 when it was opened");
  expect_config_error([&] { require_unchanged_input(files[0]); },
                      "input '" + path.string() +
                          "' changed while it was read (it holds 23 bytes now, 11 when it was "
                          "opened): it was still being written, or was rewritten in place");

  // The same size again, written in place: only the modification time tells (set apart from
  // the mapping's, as a file system with coarse times could leave it equal).
  fs::resize_file(path, 11);
  fs::last_write_time(path, fs::last_write_time(path) + std::chrono::seconds(5));
  EXPECT_EQ(files[0].change_since_mapped(), "it was modified after it was opened");

  // Replaced under its name (a new file moved into place): the mapping keeps the old one whole.
  std::ofstream(dir / "new.txt") << "another text entirely\n";
  fs::rename(dir / "new.txt", path);
  EXPECT_EQ(files[0].change_since_mapped(), "");
  fs::remove(path);
  EXPECT_EQ(files[0].change_since_mapped(), "");
  fs::remove_all(dir);
}

// A read past the end of an input cut short after it was mapped would raise SIGBUS; it ends
// the process with exit 2 and the file's name instead, also for the inputs of a second call.
TEST(MappedTextDeathTest, AReadPastTheEndOfAnInputCutShortNamesIt) {
  const fs::path dir = fs::path(::testing::TempDir()) / "mantissa_test_mapped_text_cut";
  fs::create_directories(dir);
  const fs::path path = dir / "cut.txt";
  std::ofstream(path) << std::string(3 * 4096, 'a');
  std::ofstream(dir / "earlier.txt") << "an earlier call's input\n";
  EXPECT_EXIT(
      {
        const std::vector<MappedText> earlier = map_utf8_inputs({(dir / "earlier.txt").string()});
        const std::vector<MappedText> files = map_utf8_inputs({path.string()});
        fs::resize_file(path, 10);
        const volatile char past_the_end = files[0].text()[2 * 4096];
        std::exit(past_the_end == 'a' ? 0 : 1);
      },
      ::testing::ExitedWithCode(2),
      "mantissa: input '.*cut.txt' changed while it was read \\(it was cut short: a read past "
      "its end failed\\)");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace mantissa::launcher
