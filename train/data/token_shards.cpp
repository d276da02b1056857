// Corpus::token_shards: llm.c token shards, memory-mapped and validated on load.
#include <fcntl.h>
#include <glob.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "train/data/corpus.h"

namespace mantissa::train {

namespace {

std::vector<std::string> glob_sorted(const std::string& pattern) {
  glob_t matches{};
  const int rc = glob(pattern.c_str(), 0, nullptr, &matches);  // glob sorts its results
  std::vector<std::string> paths;
  if (rc == 0) paths.assign(matches.gl_pathv, matches.gl_pathv + matches.gl_pathc);
  globfree(&matches);
  MANTISSA_CHECK(rc != GLOB_NOMATCH,
                 "token shards: pattern '" << pattern << "' matches no file (missing?)");
  MANTISSA_CHECK(
      rc == 0, "token shards: pattern '" << pattern << "': glob failed: " << std::strerror(errno));
  return paths;
}

// Maps `path` read-only and checks everything but the token values. The mapping is released
// when the returned pointer's last copy goes away.
std::shared_ptr<const void> map_shard(const std::string& path, int64_t& count) {
  const int fd = open(path.c_str(), O_RDONLY);
  MANTISSA_CHECK(fd >= 0, "token shard '" << path << "': cannot open: " << std::strerror(errno));
  struct stat st {};
  const int stat_rc = fstat(fd, &st);
  const int stat_errno = errno;
  const int64_t size = st.st_size;
  void* data =
      stat_rc == 0 && size > 0 ? mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0) : MAP_FAILED;
  const int mmap_errno = errno;
  close(fd);  // the mapping stays valid without the descriptor
  MANTISSA_CHECK(stat_rc == 0,
                 "token shard '" << path << "': cannot stat: " << std::strerror(stat_errno));
  MANTISSA_CHECK(size > 0, "token shard '" << path << "' is empty (expected a " << kShardHeaderBytes
                                           << "-byte header)");
  MANTISSA_CHECK(data != MAP_FAILED,
                 "token shard '" << path << "': cannot map: " << std::strerror(mmap_errno));
  std::shared_ptr<const void> mapping(
      data, [size](const void* p) { munmap(const_cast<void*>(p), static_cast<size_t>(size)); });

  MANTISSA_CHECK(size >= kShardHeaderBytes, "token shard '" << path << "' is truncated: " << size
                                                            << " bytes, shorter than the "
                                                            << kShardHeaderBytes << "-byte header");
  int32_t header[kShardHeaderInts];
  std::memcpy(header, data, sizeof header);
  // llm.c's Llama-3 shards (uint32 tokens, for vocabularies past 65,536) are recognised, so
  // that the refusal says what they are instead of calling them no shard at all.
  MANTISSA_CHECK(
      header[0] != kLlama3ShardMagic,
      "token shard '" << path << "' is an llm.c Llama-3 shard (magic " << kLlama3ShardMagic
                      << ", uint32 tokens); mantissa reads uint16 shards (magic " << kShardMagic
                      << ", version " << kShardVersion << ") only, so vocabularies up to 65,536");
  MANTISSA_CHECK(header[0] == kShardMagic, "token shard '" << path << "': bad magic " << header[0]
                                                           << " (expected " << kShardMagic
                                                           << "; not an llm.c token shard)");
  MANTISSA_CHECK(header[1] == kShardVersion, "token shard '" << path << "': unsupported version "
                                                             << header[1] << " (expected "
                                                             << kShardVersion << ")");
  count = header[2];
  MANTISSA_CHECK(count >= 0,
                 "token shard '" << path << "': negative token count " << count << " in header");
  const int64_t expected = kShardHeaderBytes + 2 * count;
  MANTISSA_CHECK(size == expected, "token shard '"
                                       << path << "': file size " << size
                                       << " bytes does not match the header's token count " << count
                                       << " (expected " << kShardHeaderBytes << " + 2*" << count
                                       << " = " << expected << " bytes; truncated or corrupt)");
  return mapping;
}

}  // namespace

Corpus Corpus::token_shards(const std::string& pattern, int vocab_size) {
  MANTISSA_CHECK(
      vocab_size >= 1 && vocab_size <= 65536,
      "token shards: vocab_size must lie in [1, 65536] (uint16 tokens), got " << vocab_size);
  Corpus corpus;
  corpus.name_ = pattern;
  corpus.vocab_size_ = vocab_size;
  for (const std::string& path : glob_sorted(pattern)) {
    int64_t count = 0;
    std::shared_ptr<const void> mapping = map_shard(path, count);
    const auto* tokens = reinterpret_cast<const uint16_t*>(static_cast<const char*>(mapping.get()) +
                                                           kShardHeaderBytes);
    for (int64_t i = 0; i < count; ++i) {
      MANTISSA_CHECK(tokens[i] < vocab_size,
                     "token shard '" << path << "': token " << tokens[i] << " at position " << i
                                     << " (byte offset " << kShardHeaderBytes + 2 * i
                                     << ") is >= vocab_size " << vocab_size);
    }
    corpus.segments_.push_back({path, std::span<const uint16_t>(tokens, count)});
    corpus.storage_.push_back(std::move(mapping));
  }
  return corpus;
}

}  // namespace mantissa::train
