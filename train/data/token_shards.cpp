// Corpus::token_shards: llm.c token shards, memory-mapped, their headers validated on load.
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "core/error.h"
#include "train/data/corpus.h"

namespace mantissa::train {

namespace {

// Refuses shards in a directory where `mantissa tokenize encode` did not finish moving a set
// into place (kUnfinishedShardsMarker): they may mix two sets, or be part of one.
void refuse_unfinished_encodes(const std::vector<std::string>& paths) {
  std::string checked_dir;
  for (const std::string& path : paths) {
    const std::string dir = std::filesystem::path(path).parent_path().string();
    if (dir == checked_dir) continue;
    checked_dir = dir;
    const std::string marker = (dir.empty() ? "." : dir) + "/" + kUnfinishedShardsMarker;
    const bool marked = ::access(marker.c_str(), F_OK) == 0;
    MANTISSA_REQUIRE(marked || errno == ENOENT, kFailure,
                     "token shards: cannot check for " << marker << ": " << std::strerror(errno));
    MANTISSA_REQUIRE(!marked, kConfig,
                     "token shards: '" << path << "' is in a directory whose encoding did not "
                                       << "finish (" << marker << " is there: mantissa tokenize "
                                       << "encode failed or was killed while it moved the shards "
                                       << "into place): encode again with --force");
  }
}

std::vector<std::string> glob_sorted(const std::string& pattern) {
  glob_t matches{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &matches);  // glob sorts its results
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  globfree(&matches);
  MANTISSA_REQUIRE(rc != GLOB_NOMATCH, kConfig,
                   "token shards: pattern '" << pattern << "' matches no file (missing?)");
  MANTISSA_REQUIRE(
      rc == 0, kConfig,
      "token shards: pattern '" << pattern << "': glob failed: " << std::strerror(errno));
  return paths;
}

// Maps `path` read-only and checks everything but the token values: the header (magic and
// version, of a GPT-2 or a Llama-3 shard) and that the size matches the token count. The
// mapping is released when the returned segment's storage goes away.
std::shared_ptr<const void> map_shard(const std::string& path, int64_t& count, int& token_bytes) {
  // O_NONBLOCK: a named pipe is refused below instead of blocking the open until a writer
  // comes; a regular file reads the same with it.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  MANTISSA_REQUIRE(fd >= 0, kConfig,
                   "token shard '" << path << "': cannot open: " << std::strerror(errno));
  struct stat st {};
  const int stat_rc = fstat(fd, &st);
  const int stat_errno = errno;
  const int64_t size = st.st_size;
  const bool regular = stat_rc == 0 && S_ISREG(st.st_mode);
  void* data =
      regular && size > 0 ? mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  const int mmap_errno = errno;
  close(fd);  // the mapping stays valid without the descriptor
  MANTISSA_REQUIRE(stat_rc == 0, kConfig,
                   "token shard '" << path << "': cannot stat: " << std::strerror(stat_errno));
  MANTISSA_REQUIRE(regular, kConfig, "token shard '" << path << "' is not a regular file");
  MANTISSA_REQUIRE(
      size > 0, kConfig,
      "token shard '" << path << "' is empty (expected a " << kShardHeaderBytes << "-byte header)");
  MANTISSA_REQUIRE(data != MAP_FAILED, kConfig,
                   "token shard '" << path << "': cannot map: " << std::strerror(mmap_errno));
  std::shared_ptr<const void> mapping(
      data, [size](const void* p) { munmap(const_cast<void*>(p), static_cast<size_t>(size)); });

  MANTISSA_REQUIRE(size >= kShardHeaderBytes, kConfig,
                   "token shard '" << path << "' is truncated: " << size
                                   << " bytes, shorter than the " << kShardHeaderBytes
                                   << "-byte header");
  int32_t header[kShardHeaderInts];
  std::memcpy(header, data, sizeof header);
  const bool llama3 = header[0] == kLlama3ShardMagic;
  MANTISSA_REQUIRE(llama3 || header[0] == kShardMagic, kConfig,
                   "token shard '" << path << "': bad magic " << header[0] << " (expected "
                                   << kShardMagic << " or, for uint32 tokens, " << kLlama3ShardMagic
                                   << "; not an llm.c token shard)");
  const int32_t version = llama3 ? kLlama3ShardVersion : kShardVersion;
  MANTISSA_REQUIRE(header[1] == version, kConfig,
                   "token shard '" << path << "': unsupported version " << header[1]
                                   << " (expected " << version << " with magic " << header[0]
                                   << ")");
  token_bytes = llama3 ? 4 : 2;
  count = header[2];
  MANTISSA_REQUIRE(count >= 0, kConfig,
                   "token shard '" << path << "': negative token count " << count << " in header");
  const int64_t expected = kShardHeaderBytes + token_bytes * count;
  MANTISSA_REQUIRE(size == expected, kConfig,
                   "token shard '" << path << "': file size " << size
                                   << " bytes does not match the header's token count " << count
                                   << " (expected " << kShardHeaderBytes << " + " << token_bytes
                                   << "*" << count << " = " << expected
                                   << " bytes; truncated or corrupt)");
  return mapping;
}

}  // namespace

Corpus Corpus::token_shards(const std::string& pattern, int64_t vocab_size) {
  MANTISSA_CHECK(vocab_size >= 1 && vocab_size <= INT32_MAX,
                 "token shards: vocab_size must lie in [1, "
                     << INT32_MAX << "] (int32 token ids), got " << vocab_size);
  Corpus corpus;
  corpus.name_ = pattern;
  corpus.vocab_size_ = vocab_size;
  const std::vector<std::string> paths = glob_sorted(pattern);
  refuse_unfinished_encodes(paths);
  for (const std::string& path : paths) {
    int64_t count = 0;
    int token_bytes = 0;
    std::shared_ptr<const void> mapping = map_shard(path, count, token_bytes);
    const char* tokens = static_cast<const char*>(mapping.get()) + kShardHeaderBytes;
    corpus.segments_.emplace_back(path, tokens, count, token_bytes);
    corpus.storage_.push_back(std::move(mapping));
  }
  return corpus;
}

}  // namespace mantissa::train
