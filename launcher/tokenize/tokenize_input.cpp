#include "launcher/tokenize/tokenize_input.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <utility>
#include <vector>

#include "core/cpu_affinity.h"
#include "core/error.h"
#include "core/interrupt.h"

namespace mantissa::launcher {

namespace {

// About a few seconds of reading from disk.
constexpr size_t kAnnouncedCheckBytes = size_t{1} << 30;

std::string changed_message(const std::string& path, const std::string& change) {
  return "input '" + path + "' changed while it was read (" + change +
         "): it was still being written, or was rewritten in place; nothing was written: run "
         "again once the file is complete";
}

// A read of a mapped file past the end it has now (it was cut short after it was mapped, e.g.
// rewritten through `>`) raises SIGBUS at an address inside its mapping: the handler names the
// file and exits as a ConfigError would (exit 2; the staged output's temporary files are
// cleared by the next encode into that directory). Each map_utf8_inputs publishes the mappings
// of its inputs, complete, before it installs the handler, and none is ever freed, since a
// signal may come at any time after; the handler only reads them and calls async-signal-safe
// functions.
struct InputMapping {
  uintptr_t begin;
  uintptr_t end;
  std::string message;
};
std::atomic<const std::vector<InputMapping>*> g_input_mappings{nullptr};

void name_the_input_cut_short(int, siginfo_t* info, void*) {
  const auto address = reinterpret_cast<uintptr_t>(info->si_addr);
  for (const InputMapping& mapping : *g_input_mappings.load()) {
    if (address >= mapping.begin && address < mapping.end) {
      (void)!::write(STDERR_FILENO, mapping.message.data(), mapping.message.size());
      ::_exit(core::exit_code(core::ErrorKind::kConfig));
    }
  }
  // Not an input: the faulting read runs again and ends the process as SIGBUS does.
  ::signal(SIGBUS, SIG_DFL);
}

void name_inputs_cut_short(const std::vector<MappedText>& files) {
  auto* mappings = new std::vector<InputMapping>();
  for (const MappedText& file : files) {
    const auto begin = reinterpret_cast<uintptr_t>(file.text().data());
    mappings->push_back(
        {begin, begin + file.text().size(),
         "mantissa: " +
             changed_message(file.path(), "it was cut short: a read past its end failed") + "\n"});
  }
  // An earlier call's set stays allocated: the handler may be reading it.
  g_input_mappings.store(mappings);
  struct sigaction action {};
  action.sa_sigaction = name_the_input_cut_short;
  action.sa_flags = SA_SIGINFO;
  sigemptyset(&action.sa_mask);
  ::sigaction(SIGBUS, &action, nullptr);
}

}  // namespace

MappedText::MappedText(std::string path) : path_(std::move(path)) {
  // O_NONBLOCK: a named pipe is refused below instead of blocking the open until a writer
  // comes; a regular file reads the same with it.
  const int fd = ::open(path_.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    throw core::ConfigError("cannot read input '" + path_ + "': " + std::strerror(errno));
  }
  struct stat st {};
  const int stat_rc = ::fstat(fd, &st);
  const int stat_errno = errno;
  void* data = MAP_FAILED;
  int map_errno = 0;
  // A file of size 0 that still reads (a /proc or /sys file, whose size says nothing) cannot
  // be mapped: told apart from an empty one.
  bool reads_past_its_size = false;
  if (stat_rc == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    data = ::mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    map_errno = errno;
  } else if (stat_rc == 0 && S_ISREG(st.st_mode)) {
    char byte;
    reads_past_its_size = ::read(fd, &byte, 1) == 1;
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  if (stat_rc != 0) {
    throw core::ConfigError("cannot read input '" + path_ + "': " + std::strerror(stat_errno));
  }
  if (!S_ISREG(st.st_mode)) {
    throw core::ConfigError(
        "input '" + path_ + "' is not a regular file" +
        (S_ISDIR(st.st_mode) ? "" : " (a pipe or a device: write the text to a file first)"));
  }
  if (st.st_size == 0) {
    throw core::ConfigError("input '" + path_ + "' " +
                            (reads_past_its_size ? "gives its size as 0 but holds text (a /proc "
                                                   "or /sys file): copy it to a file first"
                                                 : "is empty"));
  }
  if (data == MAP_FAILED) {
    throw core::ConfigError("cannot read input '" + path_ + "': " + std::strerror(map_errno));
  }
  data_ = static_cast<const char*>(data);
  size_ = static_cast<size_t>(st.st_size);
  device_ = st.st_dev;
  inode_ = st.st_ino;
  modified_ = st.st_mtim;
  // Read front to back, once per pass.
  ::madvise(data, size_, MADV_SEQUENTIAL);
}

MappedText::MappedText(MappedText&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      device_(other.device_),
      inode_(other.inode_),
      modified_(other.modified_) {}

MappedText::~MappedText() {
  if (data_ != nullptr) ::munmap(const_cast<char*>(data_), size_);
}

std::string MappedText::change_since_mapped() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0 || st.st_dev != device_ || st.st_ino != inode_) return "";
  if (static_cast<size_t>(st.st_size) != size_) {
    return "it holds " + std::to_string(st.st_size) + " bytes now, " + std::to_string(size_) +
           " when it was opened";
  }
  if (st.st_mtim.tv_sec != modified_.tv_sec || st.st_mtim.tv_nsec != modified_.tv_nsec) {
    return "it was modified after it was opened";
  }
  return "";
}

void require_unchanged_input(const MappedText& file) {
  const std::string change = file.change_since_mapped();
  if (!change.empty()) throw core::ConfigError(changed_message(file.path(), change));
}

int usable_cores() {
  return std::max(1, static_cast<int>(core::affinity_cpus(0).size()));
}

std::string format_bytes(double bytes) {
  if (bytes == 1) return "1 byte";
  const char* units[] = {"bytes", "kB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 4) {
    bytes /= 1000;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text, unit == 0 ? "%.0f %s" : "%.1f %s", bytes, units[unit]);
  return text;
}

size_t first_invalid_utf8(std::string_view text) {
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  size_t i = 0;
  while (i < n) {
    // ASCII runs, eight bytes at a time: no byte has its top bit set.
    if (i + 8 <= n) {
      uint64_t word;
      std::memcpy(&word, s + i, 8);
      if ((word & 0x8080808080808080ull) == 0) {
        i += 8;
        continue;
      }
    }
    const unsigned c = s[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    // The lead byte fixes the length and the range of the second byte (RFC 3629's table):
    // E0 and F0 exclude overlong forms, ED the surrogates, F4 what lies above U+10FFFF;
    // C0, C1 and F5..FF never occur.
    size_t len = 0;
    unsigned lo = 0x80;
    unsigned hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      len = 2;
    } else if (c == 0xE0) {
      len = 3;
      lo = 0xA0;
    } else if (c == 0xED) {
      len = 3;
      hi = 0x9F;
    } else if (c >= 0xE1 && c <= 0xEF) {
      len = 3;
    } else if (c == 0xF0) {
      len = 4;
      lo = 0x90;
    } else if (c == 0xF4) {
      len = 4;
      hi = 0x8F;
    } else if (c >= 0xF1 && c <= 0xF3) {
      len = 4;
    } else {
      return i;
    }
    if (n - i < len || s[i + 1] < lo || s[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if (s[i + k] < 0x80 || s[i + k] > 0xBF) return i;
    }
    i += len;
  }
  return n;
}

size_t total_bytes(const std::vector<MappedText>& files) {
  size_t bytes = 0;
  for (const MappedText& file : files) bytes += file.text().size();
  return bytes;
}

std::vector<MappedText> map_utf8_inputs(const std::vector<std::string>& paths,
                                        const std::vector<std::string>& replaced) {
  std::map<std::pair<dev_t, ino_t>, std::string> outputs;  // the replaced files, by identity
  for (const std::string& path : replaced) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) outputs.emplace(std::pair{st.st_dev, st.st_ino}, path);
  }
  std::vector<MappedText> files;
  std::map<std::pair<dev_t, ino_t>, std::string> seen;  // each file's first name
  for (const std::string& path : paths) {
    files.emplace_back(path);
    const auto [first, is_new] = seen.emplace(files.back().identity(), path);
    if (!is_new) {
      throw core::ConfigError("input '" + path + "' is the same file as input '" + first->second +
                              "': give each file once (its text would count "
                              "twice)");
    }
    if (const auto output = outputs.find(files.back().identity()); output != outputs.end()) {
      throw core::ConfigError("input '" + path + "' is the file '" + output->second +
                              "', which this run replaces: its text would be lost; write the "
                              "output elsewhere");
    }
  }
  name_inputs_cut_short(files);
  const size_t bytes = total_bytes(files);
  if (bytes >= kAnnouncedCheckBytes) {
    std::fprintf(stderr, "mantissa: checking %s of text in %zu file%s for invalid UTF-8\n",
                 format_bytes(bytes).c_str(), files.size(), files.size() == 1 ? "" : "s");
  }
  for (const MappedText& file : files) {
    core::throw_if_interrupted();  // the check of a large corpus takes minutes
    const std::string_view text = file.text();
    const size_t offset = first_invalid_utf8(text);
    if (offset == text.size()) continue;
    // A file still being written may end inside a character: that is the change, not the text.
    require_unchanged_input(file);
    char byte[8];
    std::snprintf(byte, sizeof byte, "0x%02X", static_cast<unsigned char>(text[offset]));
    throw core::ConfigError("input '" + file.path() + "' is not valid UTF-8: byte " + byte +
                            " at offset " + std::to_string(offset));
  }
  return files;
}

}  // namespace mantissa::launcher
