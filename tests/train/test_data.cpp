// Data sources and the rank-aware loader: the synthetic corpus against its documented grammar,
// text files, llm.c token shards (every malformed case, one cut while open, more than the open
// files limit), and batch slicing, resume and re-split.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "core/error.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/data/synthetic.h"
#include "train/evaluate.h"

namespace mantissa::train {
namespace {

namespace fs = std::filesystem;

// Every token of `segment`, widened as the loader reads them.
std::vector<int32_t> tokens_of(const TokenSegment& segment, int64_t vocab_size = INT32_MAX) {
  std::vector<int32_t> tokens(static_cast<size_t>(segment.size()));
  segment.read(0, tokens, vocab_size);
  return tokens;
}

// ---------------------------------------------------------------------------------------
// Synthetic corpus

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, sep);) parts.push_back(part);
  return parts;
}

template <size_t N>
bool in_list(const std::string_view (&words)[N], const std::string& w) {
  return std::find(std::begin(words), std::end(words), w) != std::end(words);
}

bool is_number(const std::string& s) {
  return !s.empty() && s.size() <= 3 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// "<det> [<adj>] <noun>" starting at words[i]; advances i.
bool noun_phrase(const std::vector<std::string>& words, size_t& i) {
  if (i >= words.size() || !in_list(kSyntheticDeterminers, words[i++])) return false;
  if (i < words.size() && in_list(kSyntheticAdjectives, words[i])) ++i;
  return i < words.size() && in_list(kSyntheticNouns, words[i++]);
}

enum class LineKind { kSentence, kCopy, kSum, kCount, kInvalid };

// Classifies a line by the grammar documented in train/data/synthetic.h, checking the
// predictable parts (copy halves equal, sums right, counts consecutive).
LineKind classify(const std::string& line) {
  const std::vector<std::string> words = split(line, ' ');
  if (words.size() == 3 && words[0] == "copy") {
    const std::string& w = words[1];
    const bool lower = std::all_of(w.begin(), w.end(), [](char c) { return c >= 'a' && c <= 'z'; });
    return lower && w.size() >= 3 && w.size() <= 8 && words[2] == w ? LineKind::kCopy
                                                                    : LineKind::kInvalid;
  }
  if (words.size() == 6 && words[0] == "count") {
    if (!is_number(words[1])) return LineKind::kInvalid;
    const int n = std::stoi(words[1]);
    if (n > 95) return LineKind::kInvalid;
    for (int k = 0; k < 5; ++k) {
      if (words[1 + k] != std::to_string(n + k)) return LineKind::kInvalid;
    }
    return LineKind::kCount;
  }
  const size_t plus = line.find('+');
  const size_t equals = line.find('=');
  if (words.size() == 1 && plus != std::string::npos && equals != std::string::npos) {
    const std::string a = line.substr(0, plus);
    const std::string b = line.substr(plus + 1, equals - plus - 1);
    const std::string c = line.substr(equals + 1);
    if (!is_number(a) || !is_number(b) || !is_number(c) || std::stoi(a) > 99 || std::stoi(b) > 99) {
      return LineKind::kInvalid;
    }
    return std::stoi(c) == std::stoi(a) + std::stoi(b) ? LineKind::kSum : LineKind::kInvalid;
  }
  if (line.empty() || line.back() != '.') return LineKind::kInvalid;
  const std::vector<std::string> sw = split(line.substr(0, line.size() - 1), ' ');
  size_t i = 0;
  const bool ok = noun_phrase(sw, i) && i < sw.size() && in_list(kSyntheticVerbs, sw[i++]) &&
                  noun_phrase(sw, i) && i == sw.size();
  return ok ? LineKind::kSentence : LineKind::kInvalid;
}

TEST(Synthetic, DeterministicFromTheSeed) {
  const std::vector<uint16_t> a = synthetic_tokens(7, 5000);
  EXPECT_EQ(a.size(), 5000u);
  EXPECT_EQ(a, synthetic_tokens(7, 5000));
  EXPECT_NE(a, synthetic_tokens(8, 5000));
  // A shorter corpus is a prefix of a longer one with the same seed.
  const std::vector<uint16_t> b = synthetic_tokens(7, 1000);
  EXPECT_TRUE(std::equal(b.begin(), b.end(), a.begin()));
}

TEST(Synthetic, EveryLineFollowsTheDocumentedGrammar) {
  const std::vector<uint16_t> tokens = synthetic_tokens(1234, 40000);
  std::string text;
  for (uint16_t t : tokens) {
    ASSERT_LT(t, 128);  // ASCII text
    text += static_cast<char>(t);
  }
  std::vector<std::string> lines = split(text, '\n');
  lines.pop_back();  // the last line may be cut by the length limit
  ASSERT_GT(lines.size(), 1000u);
  int counts[5] = {};
  for (const std::string& line : lines) {
    const LineKind kind = classify(line);
    EXPECT_NE(kind, LineKind::kInvalid) << "line: '" << line << "'";
    counts[static_cast<int>(kind)] += 1;
  }
  // Kinds are drawn uniformly: each of the four is near a quarter of the lines.
  for (int k = 0; k < 4; ++k) {
    EXPECT_GT(counts[k], static_cast<int>(lines.size()) / 5) << "kind " << k;
  }
}

TEST(Synthetic, CorpusIsOneByteLevelSegment) {
  const Corpus corpus = Corpus::synthetic(3, 4096);
  EXPECT_EQ(corpus.vocab_size(), 256);
  EXPECT_EQ(corpus.num_tokens(), 4096);
  ASSERT_EQ(corpus.segments().size(), 1u);
  const std::vector<uint16_t> expected = synthetic_tokens(3, 4096);
  EXPECT_TRUE(std::ranges::equal(tokens_of(corpus.segments()[0]), expected));
}

// ---------------------------------------------------------------------------------------
// Files

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("mantissa_test_data_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string path(const std::string& name) const { return (dir_ / name).string(); }

  std::string write_bytes(const std::string& name, const std::vector<char>& bytes) const {
    std::ofstream out(path(name), std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    return path(name);
  }

  // A shard laid out by hand: 256 little-endian int32 (magic, version, count, zeros), then
  // the tokens as they are given, uint16 or uint32. `count` is what the header claims,
  // independent of tokens.size().
  template <typename Token>
  std::string write_shard(const std::string& name, const std::vector<Token>& tokens,
                          int32_t magic = 20240520, int32_t version = 1,
                          std::optional<int32_t> count = std::nullopt) const {
    std::vector<int32_t> header(256, 0);
    header[0] = magic;
    header[1] = version;
    header[2] = count.value_or(static_cast<int32_t>(tokens.size()));
    const size_t token_bytes = sizeof(Token) * tokens.size();
    std::vector<char> bytes(1024 + token_bytes);
    std::memcpy(bytes.data(), header.data(), 1024);
    std::memcpy(bytes.data() + 1024, tokens.data(), token_bytes);
    return write_bytes(name, bytes);
  }

  // The message of the core::ConfigError that `load` throws ("no error" if none): a data file
  // that is missing or malformed is input to fix, named without a source location.
  template <class F>
  static std::string error_of(F load) {
    try {
      load();
    } catch (const core::ConfigError& e) {
      EXPECT_EQ(std::string(e.what()).find(".cpp:"), std::string::npos) << e.what();
      return e.what();
    }
    return "no error";
  }

  fs::path dir_;
};

std::vector<uint16_t> iota_tokens(int n, uint16_t first = 0) {
  std::vector<uint16_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>(first + i);
  return tokens;
}

TEST_F(DataFiles, TextFileBytesAreTokens) {
  const std::string p = write_bytes("text.txt", {'h', 'i', '\0', '\x80', '\xff'});
  const Corpus corpus = Corpus::text_file(p);
  EXPECT_EQ(corpus.vocab_size(), 256);
  EXPECT_EQ(corpus.name(), p);
  ASSERT_EQ(corpus.segments().size(), 1u);
  const std::vector<uint16_t> expected = {104, 105, 0, 128, 255};
  EXPECT_TRUE(std::ranges::equal(tokens_of(corpus.segments()[0]), expected));
}

TEST_F(DataFiles, TextFileErrorsNameTheFile) {
  const std::string missing = path("missing.txt");
  std::string msg = error_of([&] { Corpus::text_file(missing); });
  EXPECT_NE(msg.find("'" + missing + "'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cannot open"), std::string::npos) << msg;

  const std::string empty = write_bytes("empty.txt", {});
  msg = error_of([&] { Corpus::text_file(empty); });
  EXPECT_NE(msg.find("'" + empty + "' is empty"), std::string::npos) << msg;

  const std::string shard = write_shard("train_000.bin", std::vector<uint16_t>(300, 7));
  msg = error_of([&] { Corpus::text_file(shard); });
  EXPECT_NE(msg.find("text file '" + shard + "' is an llm.c token shard (magic 20240520), not " +
                     "text: name shards in data.token_shards.pattern"),
            std::string::npos)
      << msg;
}

// A validation shard's token past the vocabulary stops the start (the Evaluator reads its
// windows once): it stopped the first evaluation, eval_every steps in.
TEST_F(DataFiles, AValidationTokenPastTheVocabularyStopsTheStart) {
  std::vector<uint16_t> tokens(400, 7);
  tokens[100] = 300;
  const std::string shard = write_shard("val_000.bin", tokens);
  auto corpus = std::make_shared<const Corpus>(Corpus::token_shards(shard, 256));
  const std::string message = error_of([&] { Evaluator(corpus, 16, 16 * 20, 4, 1, 0); });
  EXPECT_NE(message.find("'" + shard + "': token 300 at position 100 is >= vocab_size 256"),
            std::string::npos)
      << message;
}

TEST_F(DataFiles, ShardsLoadInSortedOrder) {
  // Written out of order: the glob result is sorted.
  write_shard("train_001.bin", iota_tokens(50, 100));
  write_shard("train_000.bin", iota_tokens(30, 0));
  write_shard("val_000.bin", iota_tokens(10, 7));
  const Corpus corpus = Corpus::token_shards(path("train_*.bin"), 256);
  EXPECT_EQ(corpus.vocab_size(), 256);
  EXPECT_EQ(corpus.num_tokens(), 80);
  ASSERT_EQ(corpus.segments().size(), 2u);
  EXPECT_EQ(corpus.segments()[0].name(), path("train_000.bin"));
  EXPECT_EQ(corpus.segments()[1].name(), path("train_001.bin"));
  EXPECT_TRUE(std::ranges::equal(tokens_of(corpus.segments()[0]), iota_tokens(30, 0)));
  EXPECT_TRUE(std::ranges::equal(tokens_of(corpus.segments()[1]), iota_tokens(50, 100)));
}

// The fingerprint follows the tokens, not the files' names, places or token widths; it samples
// 64 tokens at the start, middle and end of each segment.
TEST_F(DataFiles, FingerprintFollowsTheTokensNotThePaths) {
  const std::vector<uint16_t> a = iota_tokens(1000, 3), b = iota_tokens(500, 9);
  const auto fingerprint = [&](const std::string& sub,
                               const std::vector<std::vector<uint16_t>>& shards) {
    fs::create_directories(dir_ / sub);
    for (size_t i = 0; i < shards.size(); ++i) {
      write_shard(sub + "/shard_" + std::to_string(i) + ".bin", shards[i]);
    }
    return Corpus::token_shards(path(sub + "/shard_*.bin"), 65536).fingerprint();
  };
  const uint64_t original = fingerprint("original", {a, b});
  EXPECT_EQ(fingerprint("moved", {a, b}), original);
  fs::create_directories(dir_ / "wide");
  write_shard("wide/shard_0.bin", std::vector<uint32_t>(a.begin(), a.end()), 20240801, 7);
  write_shard("wide/shard_1.bin", std::vector<uint32_t>(b.begin(), b.end()), 20240801, 7);
  EXPECT_EQ(Corpus::token_shards(path("wide/shard_*.bin"), 65536).fingerprint(), original);
  EXPECT_NE(fingerprint("reordered", {b, a}), original);
  EXPECT_NE(fingerprint("one_more", {a, b, b}), original);
  EXPECT_NE(fingerprint("shorter", {a, iota_tokens(499, 9)}), original);
  std::vector<uint16_t> changed = a;
  changed[500] = 7;  // in the middle sample, tokens [468, 532)
  EXPECT_NE(fingerprint("changed_in_sample", {changed, b}), original);
  changed = a;
  changed[200] = 7;  // between the samples: not seen, as corpus.h says
  EXPECT_EQ(fingerprint("changed_between_samples", {changed, b}), original);
}

TEST_F(DataFiles, ShardWithTheLargestTokens) {
  write_shard("big.bin", std::vector<uint16_t>{0, 50256, 65535});
  const Corpus corpus = Corpus::token_shards(path("big.bin"), 65536);
  EXPECT_EQ(corpus.num_tokens(), 3);
  EXPECT_EQ(tokens_of(corpus.segments()[0], 65536), (std::vector<int32_t>{0, 50256, 65535}));
  // Token values are checked as they are read, not when the shard is opened.
  const Corpus small = Corpus::token_shards(path("big.bin"), 50257);
  std::vector<int32_t> two(2);
  small.segments()[0].read(0, two, small.vocab_size());
  EXPECT_EQ(two, (std::vector<int32_t>{0, 50256}));
  const std::string msg = error_of([&] { tokens_of(small.segments()[0], 50257); });
  EXPECT_NE(msg.find("'" + path("big.bin") + "': token 65535 at position 2 is >= vocab_size 50257"),
            std::string::npos)
      << msg;
}

TEST_F(DataFiles, Llama3ShardsHoldUint32Tokens) {
  // llm.c's Llama-3 shards: magic 20240801, version 7, 4-byte tokens, here past 2^16.
  const std::vector<uint32_t> ids = {128000, 9906, 65536, 128255, 0};
  write_shard("llama_000.bin", ids, 20240801, 7);
  write_shard("llama_001.bin", std::vector<uint16_t>{7, 8, 9});  // a GPT-2 shard may sit beside it
  const Corpus corpus = Corpus::token_shards(path("llama_*.bin"), 128256);
  ASSERT_EQ(corpus.segments().size(), 2u);
  EXPECT_EQ(corpus.num_tokens(), 8);
  EXPECT_EQ(corpus.segments()[0].token_bytes(), 4);
  EXPECT_EQ(corpus.segments()[1].token_bytes(), 2);
  EXPECT_TRUE(std::ranges::equal(tokens_of(corpus.segments()[0], 128256), ids));
  EXPECT_EQ(tokens_of(corpus.segments()[1], 128256), (std::vector<int32_t>{7, 8, 9}));

  // A view keeps the token's position in its file for messages.
  const TokenSegment tail = corpus.segments()[0].subspan(2, 3);
  EXPECT_EQ(tokens_of(tail, 128256), (std::vector<int32_t>{65536, 128255, 0}));
  const std::string msg = error_of([&] { tokens_of(tail, 128000); });
  EXPECT_NE(msg.find("token 128255 at position 3 is >= vocab_size 128000"), std::string::npos)
      << msg;
}

TEST_F(DataFiles, EveryBadShardNamesTheFileAndTheProblem) {
  struct Case {
    std::string file;
    std::string expected;  // part of the message after the file name
  };
  std::vector<Case> cases;

  cases.push_back({write_bytes("empty.bin", {}), "is empty"});
  cases.push_back({write_bytes("short.bin", std::vector<char>(500, 0)), "is truncated: 500 bytes"});
  cases.push_back({write_shard("magic.bin", iota_tokens(8), 20240326),
                   "bad magic 20240326 (expected 20240520 or, for uint32 tokens, 20240801"});
  cases.push_back({write_shard("version.bin", iota_tokens(8), 20240520, 2),
                   "unsupported version 2 (expected 1 with magic 20240520)"});
  cases.push_back({write_shard("llama3_version.bin", std::vector<uint32_t>(8, 1), 20240801, 1),
                   "unsupported version 1 (expected 7 with magic 20240801)"});
  // 8 uint16 tokens where the Llama-3 header promises 8 uint32 ones.
  cases.push_back({write_shard("llama3_size.bin", iota_tokens(8), 20240801, 7),
                   "file size 1040 bytes does not match the header's token count 8 (expected "
                   "1024 + 4*8 = 1056 bytes"});
  // The header claims 10 tokens, 9 are there: 1024 + 18 bytes instead of 1024 + 20.
  cases.push_back({write_shard("truncated.bin", iota_tokens(9), 20240520, 1, 10),
                   "file size 1042 bytes does not match the header's token count 10"});
  cases.push_back({write_shard("long.bin", iota_tokens(9), 20240520, 1, 8),
                   "file size 1042 bytes does not match the header's token count 8"});
  cases.push_back(
      {write_shard("negative.bin", iota_tokens(2), 20240520, 1, -3), "negative token count -3"});

  for (const Case& c : cases) {
    SCOPED_TRACE(c.file);
    const std::string msg = error_of([&] { Corpus::token_shards(c.file, 256); });
    EXPECT_NE(msg.find("token shard '" + c.file + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.expected), std::string::npos) << msg;
  }
}

TEST_F(DataFiles, BadShardAmongGoodOnesIsNamed) {
  write_shard("part_000.bin", iota_tokens(20));
  const std::string bad = write_shard("part_001.bin", iota_tokens(20), 1234);
  const std::string msg = error_of([&] { Corpus::token_shards(path("part_*.bin"), 256); });
  EXPECT_NE(msg.find("token shard '" + bad + "': bad magic 1234"), std::string::npos) << msg;
}

TEST_F(DataFiles, MissingShardsNameThePattern) {
  const std::string pattern = path("nothing_*.bin");
  std::string msg = error_of([&] { Corpus::token_shards(pattern, 256); });
  EXPECT_NE(msg.find("'" + pattern + "' matches no file"), std::string::npos) << msg;
  const std::string missing = path("missing.bin");
  msg = error_of([&] { Corpus::token_shards(missing, 256); });
  EXPECT_NE(msg.find("'" + missing + "' matches no file"), std::string::npos) << msg;
}

// A shard is read as batches need it: one cut (or rewritten shorter) while a run holds it open
// is an error naming the file and the byte, where a memory mapping would die of SIGBUS.
TEST_F(DataFiles, ShardCutWhileOpenIsNamedWhenRead) {
  const std::string shard = write_shard("cut.bin", iota_tokens(4000));
  const Corpus corpus = Corpus::token_shards(shard, 65536);
  const TokenSegment& segment = corpus.segments()[0];
  std::vector<int32_t> window(17);
  segment.read(3900, window, 65536);
  EXPECT_EQ(window.front(), 3900);

  fs::resize_file(shard, 1024 + 2 * 3000);
  segment.read(2000, window, 65536);  // what is left still reads
  EXPECT_EQ(window.front(), 2000);
  const std::string msg = error_of([&] { segment.read(3900, window, 65536); });
  EXPECT_NE(msg.find("token shard '" + shard +
                     "' holds 7024 bytes, 9024 when the run opened it "
                     "(a read at byte 8824 found its end): it was cut or rewritten while the run "
                     "read it"),
            std::string::npos)
      << msg;
}

// One descriptor a shard stays open: the soft limit on open files is raised for them as far as
// the hard limit allows, and past that the message names the limit (in a child process: the
// limits are the process's).
TEST_F(DataFiles, ShardsPastTheOpenFilesLimitNameIt) {
  for (int i = 0; i < 40; ++i)
    write_shard("many_" + std::to_string(100 + i) + ".bin", iota_tokens(8));
  const auto load_under = [&](rlim_t soft, rlim_t hard) {
    const rlimit limit{soft, hard};
    if (setrlimit(RLIMIT_NOFILE, &limit) != 0) std::_Exit(3);
    try {
      const Corpus corpus = Corpus::token_shards(path("many_*.bin"), 256);
      std::fprintf(stderr, "loaded %zu shards\n", corpus.segments().size());
      std::_Exit(0);
    } catch (const core::ConfigError& e) {
      std::fprintf(stderr, "%s\n", e.what());
      std::_Exit(2);
    }
  };
  rlimit now{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &now), 0);
  if (now.rlim_max != RLIM_INFINITY && now.rlim_max < 1024)
    GTEST_SKIP() << "the hard limit on open files is " << now.rlim_max << ", under 1024";
  EXPECT_EXIT(load_under(32, 1024), testing::ExitedWithCode(0), "loaded 40 shards");
  EXPECT_EXIT(load_under(32, 32), testing::ExitedWithCode(2),
              "a corpus of 40 shards is held open, a descriptor each, and the process may open "
              "32 files");
}

// ---------------------------------------------------------------------------------------
// DataLoader

class Loader : public DataFiles {
 protected:
  // A corpus whose token at position p is p, so every window must read start, start + 1, ...
  void SetUp() override {
    DataFiles::SetUp();
    write_shard("count.bin", iota_tokens(5000));
    corpus_ = std::make_shared<const Corpus>(Corpus::token_shards(path("count.bin"), 65536));
  }

  DataLoader loader(int64_t micro_batch, int world_size, int rank, uint64_t seed = 42) const {
    return DataLoader(corpus_, {kSeqLen, micro_batch, world_size, rank, seed});
  }

  // The global batch of one step: every rank's slice, concatenated in rank order.
  static std::vector<int32_t> global_tokens(std::vector<DataLoader>& ranks) {
    std::vector<int32_t> all;
    for (DataLoader& l : ranks) {
      const Batch b = l.next();
      all.insert(all.end(), b.tokens.begin(), b.tokens.end());
    }
    return all;
  }

  std::vector<DataLoader> world(int world_size, int64_t micro_batch) const {
    std::vector<DataLoader> ranks;
    for (int r = 0; r < world_size; ++r) ranks.push_back(loader(micro_batch, world_size, r));
    return ranks;
  }

  static constexpr int64_t kSeqLen = 16;
  std::shared_ptr<const Corpus> corpus_;
};

TEST_F(Loader, RowsAreContiguousWindowsAndTargetsAreShiftedByOne) {
  DataLoader l = loader(4, 1, 0);
  for (int step = 0; step < 5; ++step) {
    const Batch b = l.next();
    ASSERT_EQ(b.batch_size, 4);
    ASSERT_EQ(b.seq_len, kSeqLen);
    ASSERT_EQ(b.tokens.size(), 4u * kSeqLen);
    ASSERT_EQ(b.targets.size(), 4u * kSeqLen);
    for (int64_t row = 0; row < 4; ++row) {
      const int32_t start = b.tokens[row * kSeqLen];
      EXPECT_LE(start + kSeqLen, 4999);  // the target of the last position exists
      for (int64_t t = 0; t < kSeqLen; ++t) {
        EXPECT_EQ(b.tokens[row * kSeqLen + t], start + t);
        EXPECT_EQ(b.targets[row * kSeqLen + t], start + t + 1);
      }
    }
  }
}

TEST_F(Loader, RankSlicesOfWorldSizes124ReconstructTheSameGlobalBatch) {
  // Global batch of 8 windows per step: 1x8, 2x4, 4x2.
  std::vector<DataLoader> w1 = world(1, 8), w2 = world(2, 4), w4 = world(4, 2);
  for (int step = 0; step < 4; ++step) {
    const std::vector<int32_t> g1 = global_tokens(w1);
    EXPECT_EQ(global_tokens(w2), g1) << "step " << step;
    EXPECT_EQ(global_tokens(w4), g1) << "step " << step;
    // ... and it is windows [8 * step, 8 * step + 8) of the stream.
    std::vector<int32_t> window(kSeqLen + 1);
    for (int i = 0; i < 8; ++i) {
      w1[0].read_window(8 * step + i, window);
      EXPECT_TRUE(std::equal(window.begin(), window.end() - 1, g1.begin() + i * kSeqLen));
    }
  }
}

TEST_F(Loader, DeterministicFromTheSeed) {
  for (WindowSampling sampling : {WindowSampling::kEpochs, WindowSampling::kRandom}) {
    const auto with_seed = [&](uint64_t seed) {
      return DataLoader(corpus_, {kSeqLen, 4, 1, 0, seed, sampling});
    };
    DataLoader a = with_seed(1), b = with_seed(1), c = with_seed(2);
    const std::vector<int32_t> first = a.next().tokens;
    EXPECT_EQ(b.next().tokens, first);
    EXPECT_NE(c.next().tokens, first);
  }
}

TEST_F(Loader, CursorRestoresTheStreamUnderAnyWorldSize) {
  std::vector<DataLoader> w2 = world(2, 4);
  for (int step = 0; step < 3; ++step) global_tokens(w2);
  const DataCursor saved = w2[0].cursor();
  EXPECT_EQ(saved.next_window, 24);
  EXPECT_EQ(w2[1].cursor(), saved);  // every rank holds the same cursor
  std::vector<std::vector<int32_t>> continued;
  for (int step = 0; step < 3; ++step) continued.push_back(global_tokens(w2));

  // Same global batch size, other world sizes: the same batches.
  for (auto [world_size, micro_batch] : {std::pair{2, 4}, std::pair{4, 2}, std::pair{1, 8}}) {
    std::vector<DataLoader> resumed = world(world_size, micro_batch);
    for (DataLoader& l : resumed) l.set_cursor(saved);
    for (int step = 0; step < 3; ++step) {
      EXPECT_EQ(global_tokens(resumed), continued[step]) << "world " << world_size;
    }
  }

  // Another global batch size: the same stream, cut differently (two steps of 12 windows
  // hold the three steps of 8 above).
  std::vector<DataLoader> w4 = world(4, 3);
  for (DataLoader& l : w4) l.set_cursor(saved);
  std::vector<int32_t> stream;
  for (int step = 0; step < 2; ++step) {
    const std::vector<int32_t> g = global_tokens(w4);
    stream.insert(stream.end(), g.begin(), g.end());
  }
  std::vector<int32_t> expected;
  for (const auto& g : continued) expected.insert(expected.end(), g.begin(), g.end());
  EXPECT_EQ(stream, expected);
}

TEST_F(Loader, WindowsStayInsideOneSegmentAndCoverAllSegments) {
  write_shard("seg_000.bin", iota_tokens(40, 0));
  write_shard("seg_001.bin", iota_tokens(10, 500));  // too short for a window: never used
  write_shard("seg_002.bin", iota_tokens(40, 1000));
  auto corpus = std::make_shared<const Corpus>(Corpus::token_shards(path("seg_*.bin"), 65536));
  for (WindowSampling sampling : {WindowSampling::kEpochs, WindowSampling::kRandom}) {
    const DataLoader l(corpus, {kSeqLen, 1, 1, 0, 9, sampling});
    std::vector<int32_t> window(kSeqLen + 1);
    std::set<int32_t> starts;
    for (int64_t k = 0; k < 400; ++k) {
      l.read_window(k, window);
      for (int64_t t = 1; t <= kSeqLen; ++t) ASSERT_EQ(window[t], window[0] + t) << "window " << k;
      ASSERT_TRUE(window[0] < 40 - kSeqLen || (window[0] >= 1000 && window[0] < 1040 - kSeqLen))
          << "window " << k << " starts at token " << window[0];
      starts.insert(window[0]);
    }
    // Each long segment holds 2 windows end to end (epochs) or 24 starts (random): 400 windows
    // read every one of them (a start missed by random draws: about 48 x e^-8 = 2%; this seed
    // misses none).
    const size_t expected = sampling == WindowSampling::kEpochs ? 4 : 48;
    EXPECT_EQ(starts.size(), expected);
    EXPECT_EQ(starts.count(1000), 1u);
  }
  // The short one is named, for the start's note; a segment of exactly T + 1 tokens is read.
  const DataLoader l(corpus, {kSeqLen, 1, 1, 0, 9});
  EXPECT_EQ(l.unread_segments(), std::vector<std::string>{path("seg_001.bin") + " (10 tokens)"});
  write_shard("seg_003.bin", iota_tokens(kSeqLen + 1, 2000));
  write_shard("seg_004.bin", iota_tokens(kSeqLen, 3000));
  const DataLoader more(
      std::make_shared<const Corpus>(Corpus::token_shards(path("seg_*.bin"), 65536)),
      {kSeqLen, 1, 1, 0, 9});
  EXPECT_EQ(more.unread_segments(),
            (std::vector<std::string>{path("seg_001.bin") + " (10 tokens)",
                                      path("seg_004.bin") + " (16 tokens)"}));
}

TEST_F(Loader, EpochsReadEveryWindowOnceAnEpochInAnOrderShuffledPerEpoch) {
  // Two segments: 3 windows end to end and 5 tokens short of a fourth, then `windows` windows
  // and 1 token more than them. The permutation's domain takes sizes from 1 to a few hundred,
  // powers of two or not.
  for (int windows : {0, 1, 2, 5, 8, 17, 309}) {
    const std::string tag = "_w" + std::to_string(windows) + ".bin";
    write_shard("a" + tag, iota_tokens(3 * kSeqLen + 1 + 5, 0));
    write_shard("b" + tag, iota_tokens(windows * kSeqLen + 1, 10000));
    std::vector<int32_t> starts_expected = {0, kSeqLen, 2 * kSeqLen};
    for (int j = 0; j < windows; ++j) starts_expected.push_back(10000 + j * kSeqLen);
    const auto corpus =
        std::make_shared<const Corpus>(Corpus::token_shards(path("*" + tag), 65536));
    const DataLoader l(corpus, {kSeqLen, 1, 1, 0, 3});
    const int64_t per_epoch = l.windows_per_epoch();
    ASSERT_EQ(per_epoch, 3 + windows);
    std::vector<int32_t> window(kSeqLen + 1);
    std::vector<std::vector<int32_t>> orders;
    for (int64_t epoch = 0; epoch < 3; ++epoch) {
      std::vector<int32_t> starts;
      for (int64_t k = epoch * per_epoch; k < (epoch + 1) * per_epoch; ++k) {
        l.read_window(k, window);
        for (int64_t t = 1; t <= kSeqLen; ++t) ASSERT_EQ(window[t], window[0] + t) << k;
        starts.push_back(window[0]);
      }
      orders.push_back(starts);
      std::sort(starts.begin(), starts.end());
      EXPECT_EQ(starts, starts_expected) << windows << " windows, epoch " << epoch;
    }
    if (windows == 309) {
      EXPECT_FALSE(std::is_sorted(orders[0].begin(), orders[0].end()));
      EXPECT_NE(orders[0], orders[1]);
      EXPECT_NE(orders[1], orders[2]);
    }
  }
}

TEST_F(Loader, EpochsBeginAtTheCursorsOrigin) {
  // A cursor carried over to this corpus at window 1000: from there, each epoch of 312 windows
  // reads every window once, and epochs_read counts from there.
  DataLoader l = loader(1, 1, 0);
  l.set_cursor({1000, 0});
  l.start_epochs_here();
  EXPECT_EQ(l.cursor(), (DataCursor{1000, 1000}));
  EXPECT_EQ(l.epochs_read(), 0.0);
  std::vector<int32_t> starts;
  for (int64_t i = 0; i < 312; ++i) starts.push_back(l.next().tokens[0]);
  std::sort(starts.begin(), starts.end());
  for (int32_t j = 0; j < 312; ++j) ASSERT_EQ(starts[static_cast<size_t>(j)], j * kSeqLen);
  EXPECT_EQ(l.epochs_read(), 1.0);
  // The origin lies within the cursor's windows, and no window before it is an epoch's.
  std::vector<int32_t> window(kSeqLen + 1);
  EXPECT_THROW(l.read_window(999, window), core::Error);
  EXPECT_THROW(l.set_cursor({10, 11}), core::Error);
  EXPECT_THROW(l.set_cursor({10, -1}), core::Error);
}

TEST_F(Loader, EachWindowTakesEveryPlaceOfAnEpochAlike) {
  // Where the first window of the corpus lands in its epoch: uniform over the 5 places of an
  // epoch of 5 windows (40000 epochs) and over the 10 tenths of an epoch of 1000 (2000 epochs).
  // Chi-squared passes 33 (4 degrees of freedom) or 47 (9) with probability about 1e-6. Four
  // Feistel rounds with their own keys gave 141 at 5 windows; four sharing one function, 2064.
  for (const auto& [windows, bins, epochs, limit] :
       {std::tuple{5, 5, 40000, 33.0}, std::tuple{1000, 10, 2000, 47.0}}) {
    const std::string name = "w" + std::to_string(windows) + ".bin";
    write_shard(name, iota_tokens(windows * kSeqLen + 1));
    const DataLoader l(std::make_shared<const Corpus>(Corpus::token_shards(path(name), 65536)),
                       {kSeqLen, 1, 1, 0, 7});
    ASSERT_EQ(l.windows_per_epoch(), windows);
    std::vector<int> landed(static_cast<size_t>(bins));
    std::vector<int32_t> window(kSeqLen + 1);
    for (int64_t epoch = 0; epoch < epochs; ++epoch) {
      for (int64_t place = 0; place < windows; ++place) {
        l.read_window(epoch * windows + place, window);
        if (window[0] == 0) ++landed[static_cast<size_t>(place * bins / windows)];
      }
    }
    double chi2 = 0;
    const double expected = static_cast<double>(epochs) / bins;
    for (int count : landed) chi2 += (count - expected) * (count - expected) / expected;
    EXPECT_LT(chi2, limit) << windows << " windows an epoch";
  }
}

TEST_F(Loader, RandomSamplingStartsAnywhereWithReplacement) {
  // 5000 tokens: 4984 starts to draw from. 4984 draws with replacement hit about 1 - 1/e = 63%
  // of them; the epochs sampling reads its 312 windows, at multiples of T, once each.
  const int64_t starts = 5000 - kSeqLen;
  const DataLoader random(corpus_, {kSeqLen, 1, 1, 0, 42, WindowSampling::kRandom});
  std::vector<int32_t> window(kSeqLen + 1);
  std::vector<int32_t> drawn;
  for (int64_t k = 0; k < starts; ++k) {
    random.read_window(k, window);
    drawn.push_back(window[0]);
  }
  EXPECT_TRUE(std::any_of(drawn.begin(), drawn.end(), [](int32_t s) { return s % kSeqLen; }));
  std::sort(drawn.begin(), drawn.end());
  const auto distinct = std::unique(drawn.begin(), drawn.end()) - drawn.begin();
  EXPECT_GT(distinct, 0.58 * starts);
  EXPECT_LT(distinct, 0.68 * starts);
}

TEST_F(Loader, EpochsReadCountTheCorpussWorthOfWindows) {
  // 312 windows of 16 hold the 5000 tokens once, for either sampling.
  for (WindowSampling sampling : {WindowSampling::kEpochs, WindowSampling::kRandom}) {
    std::vector<DataLoader> ranks;
    for (int r = 0; r < 2; ++r)
      ranks.emplace_back(corpus_, DataLoaderConfig{kSeqLen, 4, 2, r, 1, sampling});
    EXPECT_EQ(ranks[0].windows_per_epoch(), 4999 / kSeqLen);
    EXPECT_EQ(ranks[0].epochs_read(), 0.0);
    for (int step = 1; step <= 100; ++step) {
      global_tokens(ranks);
      EXPECT_EQ(ranks[1].epochs_read(), 8.0 * step / 312);
    }
  }
}

TEST_F(Loader, ATokenPastTheVocabularyStopsTheBatchThatReadsIt) {
  // seq_len + 1 tokens: the one window start covers every token, the bad one at position 5.
  std::vector<uint16_t> tokens = iota_tokens(kSeqLen + 1);
  tokens[5] = 300;
  write_shard("bad_token.bin", tokens);
  auto corpus = std::make_shared<const Corpus>(Corpus::token_shards(path("bad_token.bin"), 256));
  DataLoader l(corpus, {kSeqLen, 1, 1, 0, 0});
  const std::string msg = error_of([&] { l.next(); });
  EXPECT_NE(
      msg.find("'" + path("bad_token.bin") + "': token 300 at position 5 is >= vocab_size 256"),
      std::string::npos)
      << msg;
}

TEST_F(Loader, RejectsCorpusWithoutAWindowAndBadConfigs) {
  write_shard("tiny.bin", iota_tokens(10));
  auto tiny = std::make_shared<const Corpus>(Corpus::token_shards(path("tiny.bin"), 256));
  const std::string msg = error_of([&] { DataLoader(tiny, {kSeqLen, 1, 1, 0, 0}); });
  EXPECT_NE(msg.find(path("tiny.bin")), std::string::npos) << msg;
  EXPECT_NE(msg.find("seq_len + 1 = 17 tokens (the longest has 10)"), std::string::npos) << msg;

  EXPECT_THROW(DataLoader(corpus_, {kSeqLen, 1, 2, 2, 0}), core::Error);  // rank >= world
  EXPECT_THROW(DataLoader(corpus_, {kSeqLen, 0, 1, 0, 0}), core::Error);
  EXPECT_THROW(DataLoader(corpus_, {0, 1, 1, 0, 0}), core::Error);
  DataLoader l = loader(1, 1, 0);
  EXPECT_THROW(l.set_cursor({-1}), core::Error);
}

}  // namespace
}  // namespace mantissa::train
