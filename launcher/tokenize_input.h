// The text files `mantissa tokenize` reads: mapped read-only, and checked to be readable,
// non-empty and valid UTF-8, each failure naming the file (and for UTF-8 the byte offset).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

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

 private:
  std::string path_;
  const char* data_ = nullptr;
  size_t size_ = 0;
};

// The cores this process may run on (its CPU affinity, which Slurm or taskset may narrow).
int usable_cores();

// "35.1 kB", "1.2 GB": a size for messages.
std::string format_bytes(double bytes);

// The offset of the first byte of the first invalid UTF-8 sequence in `text`, or text.size()
// when all of it is valid. Valid means RFC 3629: no overlong forms, no surrogates (U+D800 to
// U+DFFF), nothing above U+10FFFF, no sequence cut short.
size_t first_invalid_utf8(std::string_view text);

// Throws core::ConfigError "input 'PATH' is not valid UTF-8: byte 0xNN at offset N" for the
// invalid sequence that starts at `offset` of the file `path`.
[[noreturn]] void throw_invalid_utf8(const std::string& path, std::string_view file_text,
                                     size_t offset);

}  // namespace mantissa::launcher
