// A token shard held open for reading: the corpus reads its windows with pread, not through a
// memory mapping. The page cache is still shared by every rank on a node, and:
//  - a shard cut short while a run reads it (truncated, or rewritten shorter in place), or a
//    read that fails (EIO on a network file system), is an error naming the file and the
//    byte, where a mapping gets SIGBUS and dies with no word of which file;
//  - a random window brings in little more than its own pages, where a fault in a mapping
//    reads around it (random windows of the demo model from a cold 1 GB shard: 9 MiB read
//    from disk in 30 s, against 69 MiB mapped), and none stays counted in the process's
//    resident memory, which with a mapped corpus climbs towards the corpus's size over a long
//    run (130 MB in those 30 s; Slurm and monitoring count it as the job's memory).
#pragma once

#include <cstdint>
#include <span>
#include <string>

namespace mantissa::train {

class TokenFile {
 public:
  // Takes ownership of `fd`, open for reading on the regular file `path` of `size` bytes.
  TokenFile(std::string path, int fd, int64_t size);
  ~TokenFile();
  TokenFile(const TokenFile&) = delete;
  TokenFile& operator=(const TokenFile&) = delete;

  const std::string& path() const { return path_; }

  // Bytes [offset, offset + out.size()) of the file. Throws core::Error naming the file and
  // the byte: a failed read is a failure (exit 1; a retry may pass), a file that ends before
  // `size` bytes was cut or rewritten after it was opened, a config error (exit 2).
  void read(int64_t offset, std::span<char> out) const;

 private:
  int64_t size_now() const;  // for messages: -1 when fstat fails

  std::string path_;
  int fd_;
  int64_t size_;
};

}  // namespace mantissa::train
