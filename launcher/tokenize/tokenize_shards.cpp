#include "launcher/tokenize/tokenize_shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string_view>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/missing_directories.h"
#include "train/data/corpus.h"

namespace mantissa::launcher {

namespace fs = std::filesystem;

namespace {

static_assert(std::endian::native == std::endian::little,
              "llm.c shards are little-endian, written here as they lie in memory");

// A file is written under a hidden name (".train_000000.bin.tmp") until commit() renames it:
// glob(3), which reads the training config's pattern, matches a leading '.' only when the
// pattern spells it, so no pattern ("DIR/train_*", "DIR/*") picks up a staged shard, which an
// encode killed before its commit leaves.
constexpr const char* kTempSuffix = ".tmp";

std::string staged_name(const std::string& name) {
  return "." + name + kTempSuffix;
}

std::string errno_text() {
  return std::strerror(errno);
}

// What the training config's glob (DIR/train_*.bin, DIR/val_*.bin) would read.
bool matches_shard_glob(const std::string& name) {
  return (name.starts_with("train_") || name.starts_with("val_")) && name.ends_with(".bin");
}

// The names encode writes (shard_name): train_<N>.bin and val_<N>.bin, N at least 6 digits.
// --force replaces or removes these alone, never someone's train_notes.bin.
bool is_shard_name(const std::string& name) {
  const size_t prefix = name.starts_with("train_") ? 6 : name.starts_with("val_") ? 4 : 0;
  if (prefix == 0 || !name.ends_with(".bin")) return false;
  const std::string_view digits = std::string_view(name).substr(prefix, name.size() - prefix - 4);
  return digits.size() >= 6 &&
         std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// The files an encode writes: shards and the tokenizer beside them.
bool is_output_name(const std::string& name) {
  return is_shard_name(name) || name == train::kShardsTokenizerFile;
}

void rename_into_place(const std::string& from, const std::string& to) {
  MANTISSA_REQUIRE(::rename(from.c_str(), to.c_str()) == 0, kFailure,
                   "cannot rename '" << from << "' to '" << to << "': " << errno_text());
}

}  // namespace

int64_t start_at_or_before(const Tokenizer& tokenizer, const train::TokenSegment& tokens,
                           int64_t pos) {
  int64_t p = std::clamp<int64_t>(pos, 0, tokens.size());
  while (p > 0 && p < tokens.size() && !tokenizer.can_start_at(tokens.at(p))) --p;
  return p;
}

std::vector<std::pair<int64_t, int64_t>> plan_shards(const Tokenizer& tokenizer,
                                                     const train::TokenSegment& tokens,
                                                     int64_t max_tokens) {
  MANTISSA_CHECK(max_tokens >= 4, "plan_shards: max_tokens " << max_tokens << " < 4");
  std::vector<std::pair<int64_t, int64_t>> shards;
  for (int64_t begin = 0; begin < tokens.size();) {
    const int64_t limit = std::min(begin + max_tokens, tokens.size());
    int64_t end = start_at_or_before(tokenizer, tokens, limit);
    // Only a stream that is not valid UTF-8 can hold more than 3 continuation bytes in a row;
    // it is cut where the limit falls.
    if (end == begin) end = limit;
    shards.emplace_back(begin, end);
    begin = end;
  }
  return shards;
}

TokenSpill::TokenSpill(const std::string& dir, int token_bytes)
    : path_(dir + "/.mantissa-tokens-XXXXXX"), token_bytes_(token_bytes) {
  MANTISSA_CHECK(token_bytes == 2 || token_bytes == 4,
                 "token spill: " << token_bytes << "-byte tokens (2 or 4)");
  fd_ = ::mkostemp(path_.data(), O_CLOEXEC);
  if (fd_ < 0) {
    const int error = errno;
    core::throw_error_of_kind(core::path_error_kind(error), "cannot create a temporary file in '" +
                                                                dir + "': " + std::strerror(error));
  }
  ::unlink(path_.c_str());
}

TokenSpill::~TokenSpill() {
  if (mapping_ != nullptr) ::munmap(mapping_, static_cast<size_t>(tokens_ * token_bytes_));
  ::close(fd_);
}

void TokenSpill::append(std::span<const uint32_t> tokens) {
  MANTISSA_CHECK(mapping_ == nullptr, "token spill '" << path_ << "': append after map");
  buffer_.resize(tokens.size() * static_cast<size_t>(token_bytes_));
  if (token_bytes_ == 4) {
    std::memcpy(buffer_.data(), tokens.data(), buffer_.size());
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      const auto narrow = static_cast<uint16_t>(tokens[i]);
      std::memcpy(buffer_.data() + 2 * i, &narrow, 2);
    }
  }
  core::write_all(fd_, buffer_.data(), buffer_.size(), path_);
  tokens_ += static_cast<int64_t>(tokens.size());
}

train::TokenSegment TokenSpill::map() {
  const auto bytes = static_cast<size_t>(tokens_ * token_bytes_);
  if (mapping_ == nullptr && bytes > 0) {
    void* data = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd_, 0);
    MANTISSA_REQUIRE(data != MAP_FAILED, kFailure,
                     "cannot map '" << path_ << "': " << errno_text());
    mapping_ = data;
  }
  return {path_, mapping_, tokens_, token_bytes_};
}

StagedOutput::StagedOutput(std::string dir, bool replace) : dir_(std::move(dir)) {
  std::error_code ec;
  if (!fs::exists(dir_, ec)) {
    // Remember every directory this creates, so that a failure removes them again.
    created_dirs_ = core::missing_directories(dir_);
    fs::create_directories(dir_, ec);
    if (ec) {
      // Those made before the failure; no destructor runs after a constructor throws.
      for (const fs::path& created : created_dirs_) ::rmdir(created.c_str());
      // ENOENT under parents that exist: a file system that cannot hold directories (/proc).
      core::throw_error_of_kind(core::named_path_error_kind(ec.value()),
                                "cannot create output directory '" + dir_ +
                                    "': " + core::create_directories_failure(dir_, ec));
    }
    return;
  }
  if (!fs::is_directory(dir_, ec)) {
    throw core::ConfigError("output directory '" + dir_ + "' exists and is not a directory");
  }
  std::string foreign;  // a file the training glob reads that encode did not write
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_output_name(name)) {
      held_.push_back(name);
    } else if (foreign.empty() && matches_shard_glob(name)) {
      foreign = name;
    }
  }
  if (ec) {
    core::throw_error_of_kind(core::path_error_kind(ec.value()),
                              "cannot list output directory '" + dir_ + "': " + ec.message());
  }
  // Neither removed (it is no shard of encode's) nor left for the training glob to read.
  if (!foreign.empty()) {
    throw core::ConfigError("output directory '" + dir_ + "' holds " + foreign +
                            ", which training's shard pattern (train_*.bin, val_*.bin) would "
                            "read, though encode did not write it: move it elsewhere");
  }
  if (!replace && !held_.empty()) {
    std::sort(held_.begin(), held_.end());
    const bool unfinished = fs::exists(dir_ + "/" + train::kUnfinishedShardsMarker, ec);
    throw core::ConfigError("output directory '" + dir_ + "' already holds token shards (" +
                            held_.front() + (held_.size() > 1 ? ", ..." : "") + ")" +
                            (unfinished ? ", from an encode that did not finish" : "") +
                            "; --force replaces them");
  }
}

std::vector<std::string> StagedOutput::replaced_files() const {
  std::vector<std::string> out;
  for (const std::string& name : held_) out.push_back(dir_ + "/" + name);
  return out;
}

StagedOutput::~StagedOutput() {
  if (committed_) return;
  for (const std::string& name : staged_) ::unlink((dir_ + "/" + staged_name(name)).c_str());
  // rmdir removes only empty directories: whatever else appeared there stays.
  for (const fs::path& created : created_dirs_) ::rmdir(created.c_str());
}

void StagedOutput::write_shard(const std::string& name, const train::TokenSegment& tokens) {
  MANTISSA_CHECK(tokens.size() <= INT32_MAX,
                 "shard '" << name << "': " << tokens.size() << " tokens exceed the int32 count");
  const bool wide = tokens.token_bytes() == 4;
  int32_t header[train::kShardHeaderInts] = {};
  header[0] = wide ? train::kLlama3ShardMagic : train::kShardMagic;
  header[1] = wide ? train::kLlama3ShardVersion : train::kShardVersion;
  header[2] = static_cast<int32_t>(tokens.size());
  staged_.push_back(name);
  core::DurableFile file(dir_ + "/" + staged_name(name));
  file.write(header, sizeof header);
  file.write(tokens.data(), static_cast<size_t>(tokens.size() * tokens.token_bytes()));
  file.finish();
}

void StagedOutput::write_file(const std::string& name, std::string_view bytes) {
  staged_.push_back(name);
  core::DurableFile file(dir_ + "/" + staged_name(name));
  file.write(bytes.data(), bytes.size());
  file.finish();
}

void StagedOutput::commit() {
  // The files cannot all change in one step: the marker stands for the whole move, so that
  // training refuses a mix of an old and a new set, or part of one, that a failure or a crash
  // here leaves (train/data/corpus.h).
  const std::string marker = dir_ + "/" + train::kUnfinishedShardsMarker;
  core::write_file_atomically(marker,
                              "mantissa tokenize encode is moving token shards into this "
                              "directory; if it stopped, encode again with --force\n");
  try {
    for (const std::string& name : staged_) {
      rename_into_place(dir_ + "/" + staged_name(name), dir_ + "/" + name);
    }
    // What is left of an earlier set: its shards, and the staged files of an encode killed
    // before its commit (this one's are all in place by now): hidden names that only staging
    // makes. A visible "train_x.bin.tmp" or "tokenizer.model.tmp" is someone's own file.
    std::error_code ec;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir_, ec)) {
      const std::string name = entry.path().filename().string();
      const bool old_shard =
          is_shard_name(name) && std::find(staged_.begin(), staged_.end(), name) == staged_.end();
      const bool left_staged =
          name.starts_with('.') && name.ends_with(kTempSuffix) &&
          is_output_name(name.substr(1, name.size() - 1 - std::strlen(kTempSuffix)));
      if (old_shard || left_staged) {
        MANTISSA_REQUIRE(
            ::unlink(entry.path().c_str()) == 0, kFailure,
            "cannot remove the old file '" << entry.path().string() << "': " << errno_text());
      }
    }
    MANTISSA_REQUIRE(!ec, kFailure,
                     "cannot list output directory '" << dir_ << "': " << ec.message());
    core::fsync_path(dir_);
  } catch (const std::exception& e) {
    // A core::Error keeps its kind; the directory listing's filesystem_error is a failure.
    const auto* error = dynamic_cast<const core::Error*>(&e);
    core::throw_error_of_kind(error ? error->kind() : core::ErrorKind::kFailure,
                              core::error_text(e) + "; '" + dir_ +
                                  "' now holds an unfinished set of shards, which training "
                                  "refuses: encode again with --force");
  }
  MANTISSA_REQUIRE(::unlink(marker.c_str()) == 0, kFailure,
                   "cannot remove '" << marker << "': " << errno_text());
  core::fsync_path(dir_);
  committed_ = true;
}

}  // namespace mantissa::launcher
