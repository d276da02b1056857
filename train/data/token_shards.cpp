// Corpus::token_shards: llm.c token shards, held open and read a window at a time, their headers
// validated on load.
#include <fcntl.h>
#include <glob.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
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

// The soft limit on open files (ulimit -n).
rlim_t open_files_limit() {
  rlimit limit{};
  return getrlimit(RLIMIT_NOFILE, &limit) == 0 ? limit.rlim_cur : 0;
}

// Every shard stays open for the run, one descriptor each. When the shards need more than the
// soft limit on open files leaves (with room for MPI, NCCL and the rest), it is raised towards
// the hard limit, as Go's runtime does at start; an open that still fails names the limit.
void make_room_for_open_shards(size_t shards) {
  constexpr rlim_t kOtherDescriptors = 1024;
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
  const rlim_t wanted = static_cast<rlim_t>(shards) + kOtherDescriptors;
  if (limit.rlim_cur == RLIM_INFINITY || limit.rlim_cur >= wanted) return;
  limit.rlim_cur = limit.rlim_max == RLIM_INFINITY ? wanted : std::min(wanted, limit.rlim_max);
  setrlimit(RLIMIT_NOFILE, &limit);
}

// Opens `path` and checks everything but the token values: the header (magic and version, of a
// GPT-2 or a Llama-3 shard) and that the size matches the token count.
std::shared_ptr<const TokenFile> open_shard(const std::string& path, size_t shards, int64_t& count,
                                            int& token_bytes) {
  // O_NONBLOCK: a named pipe is refused below instead of blocking the open until a writer
  // comes; a regular file reads the same with it.
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  const int open_errno = errno;
  MANTISSA_REQUIRE(fd >= 0 || open_errno != EMFILE, kConfig,
                   "token shard '" << path << "': cannot open: " << std::strerror(open_errno)
                                   << " (a corpus of " << shards
                                   << " shards is held open, a descriptor each, and the "
                                   << "process may open " << open_files_limit()
                                   << " files: raise ulimit -n (its hard limit) or write "
                                   << "fewer, larger shards)");
  MANTISSA_REQUIRE(fd >= 0, kConfig,
                   "token shard '" << path << "': cannot open: " << std::strerror(open_errno));
  struct stat st {};
  const int stat_rc = fstat(fd, &st);
  const int stat_errno = errno;
  const bool regular = stat_rc == 0 && S_ISREG(st.st_mode);
  if (!regular) close(fd);
  MANTISSA_REQUIRE(stat_rc == 0, kConfig,
                   "token shard '" << path << "': cannot stat: " << std::strerror(stat_errno));
  MANTISSA_REQUIRE(regular, kConfig, "token shard '" << path << "' is not a regular file");
  const int64_t size = st.st_size;
  auto file = std::make_shared<const TokenFile>(path, fd, size);

  MANTISSA_REQUIRE(
      size > 0, kConfig,
      "token shard '" << path << "' is empty (expected a " << kShardHeaderBytes << "-byte header)");
  MANTISSA_REQUIRE(size >= kShardHeaderBytes, kConfig,
                   "token shard '" << path << "' is truncated: " << size
                                   << " bytes, shorter than the " << kShardHeaderBytes
                                   << "-byte header");
  int32_t header[kShardHeaderInts];
  file->read(0, std::span<char>(reinterpret_cast<char*>(header), sizeof header));
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
  return file;
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
  make_room_for_open_shards(paths.size());
  for (const std::string& path : paths) {
    int64_t count = 0;
    int token_bytes = 0;
    std::shared_ptr<const TokenFile> file = open_shard(path, paths.size(), count, token_bytes);
    corpus.segments_.emplace_back(std::move(file), kShardHeaderBytes, count, token_bytes);
  }
  return corpus;
}

}  // namespace mantissa::train
