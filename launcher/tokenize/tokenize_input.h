// The text files `mantissa tokenize` reads: mapped read-only, and checked to be readable,
// non-empty and valid UTF-8, each failure naming the file (and for UTF-8 the byte offset).
#pragma once

#include <sys/types.h>
#include <time.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mantissa::launcher {

// A regular, non-empty file mapped read-only for the lifetime of the object (the page cache
// holds it, so a corpus larger than memory still works).
class MappedText {
 public:
  // Throws core::ConfigError naming `path` when it cannot be opened or mapped, is not a
  // regular file, or is empty.
  explicit MappedText(std::string path);
  ~MappedText();
  MappedText(const MappedText&) = delete;
  MappedText& operator=(const MappedText&) = delete;
  MappedText(MappedText&& other) noexcept;
  MappedText& operator=(MappedText&&) = delete;

  const std::string& path() const { return path_; }
  std::string_view text() const { return {data_, size_}; }

  // What changed in the file since it was mapped, or "" when nothing did. A file appended to
  // or rewritten in place (its size or modification time differ) may have been read part old,
  // part new, or cut short at the size it had when mapped. A file replaced or removed under its
  // name is not a change here: the mapping keeps the whole file as it was. Nor is a rewrite
  // that keeps the size within the file system's time resolution (nanoseconds on ext4 and
  // XFS, up to 2 s on others).
  std::string change_since_mapped() const;
  // The file whatever its name: device and inode.
  std::pair<dev_t, ino_t> identity() const { return {device_, inode_}; }

 private:
  std::string path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
  dev_t device_ = 0;
  ino_t inode_ = 0;
  timespec modified_{};
};

// Throws core::ConfigError naming `file` when it changed since it was mapped (see
// MappedText::change_since_mapped): what was made from it would silently miss or mix text.
// Run once all reading of it is done, before anything made from it is written.
void require_unchanged_input(const MappedText& file);

// The cores this process may run on (its CPU affinity, which Slurm or taskset may narrow).
int usable_cores();

// The bytes of all `files` together.
size_t total_bytes(const std::vector<MappedText>& files);

// "35.1 kB", "1.2 GB": a size for messages.
std::string format_bytes(double bytes);

// The offset of the first byte of the first invalid UTF-8 sequence in `text`, or text.size()
// when all of it is valid. Valid means RFC 3629: no overlong forms, no surrogates (U+D800 to
// U+DFFF), nothing above U+10FFFF, no sequence cut short.
size_t first_invalid_utf8(std::string_view text);

// Maps every input, then checks that each is valid UTF-8, before any work on them begins (a
// corpus with a bad file fails in the time a read takes, not hours into encoding). Throws
// core::ConfigError naming the first file that cannot be mapped, that was given before (under
// any name: its text would count twice), or that is not valid UTF-8:
// "input 'PATH' is not valid UTF-8: byte 0xNN at offset N" (or, where it changed since it was
// mapped, that it changed). Says on stderr what it checks when that is more than a few
// seconds' reading. From then on, a read past the end of an input cut short after it was
// mapped ends the process with exit 2 and a message naming the file, not with SIGBUS.
// `replaced` are the existing files the run will replace or remove (--force's): an input that
// is one of them, under any name, is refused before the check, since the run would destroy the
// text it reads.
std::vector<MappedText> map_utf8_inputs(const std::vector<std::string>& paths,
                                        const std::vector<std::string>& replaced = {});

}  // namespace mantissa::launcher
