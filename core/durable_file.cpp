#include "core/durable_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>
#include <vector>

#include "core/error.h"

namespace mantissa::core {

namespace {

[[noreturn]] void throw_path_error(const std::string& what, int error) {
  throw_error_of_kind(path_error_kind(error), what + ": " + std::strerror(error));
}

// rename(2) that fails with EEXIST where `to` names anything (renameat2's RENAME_NOREPLACE); on
// a file system without that flag (EINVAL), a hard link, which fails the same way, then the
// unlink of `from`; on one without hard links either, a plain rename. Returns 0 or the errno.
int rename_no_replace(const std::string& from, const std::string& to) {
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_NOREPLACE) == 0) return 0;
  if (errno != EINVAL && errno != ENOSYS) return errno;
  if (::link(from.c_str(), to.c_str()) == 0) {
    ::unlink(from.c_str());
    return 0;
  }
  if (errno == EEXIST) return EEXIST;
  return ::rename(from.c_str(), to.c_str()) == 0 ? 0 : errno;
}

}  // namespace

void write_all(int fd, const void* data, size_t size, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int error = n < 0 ? errno : ENOSPC;  // a write of nothing: no room for more
      throw_path_error("cannot write '" + path + "'", error);
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
}

DurableFile::DurableFile(std::string path)
    : path_(std::move(path)),
      fd_(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644)) {
  if (fd_ < 0) {
    const int error = errno;
    throw_path_error("cannot create '" + path_ + "'", error);
  }
}

DurableFile DurableFile::temporary_beside(const std::string& path) {
  // The pid tells this process's names from others' on one host; O_EXCL settles the rest (the
  // same pid on another host of a shared file system) by taking the next number.
  static std::atomic<uint64_t> next{0};
  const std::string prefix = path + "." + std::to_string(::getpid()) + "-";
  for (int attempt = 0;; ++attempt) {
    std::string name = prefix + std::to_string(next++) + ".tmp";
    const int fd = ::open(name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd >= 0) return DurableFile(std::move(name), fd);
    const int error = errno;
    if (error != EEXIST || attempt == 99) throw_path_error("cannot create '" + name + "'", error);
  }
}

DurableFile::~DurableFile() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(path_.c_str());
}

void DurableFile::write(const void* data, size_t size) {
  write_all(fd_, data, size, path_);
}

void DurableFile::finish() {
  if (::fsync(fd_) != 0) {
    const int error = errno;
    throw_path_error("cannot write '" + path_ + "': fsync", error);
  }
  const int rc = ::close(fd_);
  const int error = errno;
  fd_ = -1;
  if (rc != 0) {
    ::unlink(path_.c_str());
    throw_path_error("cannot write '" + path_ + "': close", error);
  }
}

bool is_temporary_of(std::string_view name, std::string_view target) {
  if (name.size() <= target.size() + 5 || !name.starts_with(target) || name[target.size()] != '.' ||
      !name.ends_with(".tmp")) {
    return false;
  }
  // What lies between "<target>." and ".tmp": "<pid>-<n>".
  const std::string_view middle = name.substr(target.size() + 1, name.size() - target.size() - 5);
  const size_t dash = middle.find('-');
  const auto all_digits = [](std::string_view s) {
    return !s.empty() &&
           std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
  };
  return dash != std::string_view::npos && all_digits(middle.substr(0, dash)) &&
         all_digits(middle.substr(dash + 1));
}

namespace {

// Removes the temporaries of `path` for which `remove(the writer's pid)` holds.
void remove_temporaries_of_writers(const std::string& path,
                                   const std::function<bool(pid_t)>& remove) {
  const std::filesystem::path target(path);
  const std::filesystem::path dir = target.has_parent_path() ? target.parent_path() : ".";
  const std::string name = target.filename().string();
  std::error_code ec;
  std::vector<std::filesystem::path> left;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string file = entry.path().filename().string();
    if (!is_temporary_of(file, name)) continue;
    // "<name>.<pid>-<n>.tmp"; a pid past pid_t's range names no process (-1).
    pid_t pid = -1;
    std::from_chars(file.data() + name.size() + 1, file.data() + file.size(), pid);
    if (remove(pid)) left.push_back(entry.path());
  }
  for (const std::filesystem::path& temporary : left) std::filesystem::remove(temporary, ec);
}

}  // namespace

void remove_temporaries_of(const std::string& path) {
  remove_temporaries_of_writers(path, [](pid_t) { return true; });
}

void remove_orphaned_temporaries_of(const std::string& path) {
  remove_temporaries_of_writers(
      path, [](pid_t pid) { return pid <= 0 || (::kill(pid, 0) != 0 && errno == ESRCH); });
}

void fsync_path(const std::string& path) {
  // O_RDONLY suffices: fsync flushes the file's (or directory's) data whatever the mode.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MANTISSA_REQUIRE(fd >= 0, kFailure,
                   "cannot open '" << path << "' to sync it: " << std::strerror(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  MANTISSA_REQUIRE(rc == 0, kFailure, "fsync of '" << path << "' failed: " << std::strerror(error));
}

void fsync_parent_directory(const std::string& path) {
  const std::string parent = std::filesystem::path(path).parent_path().string();
  fsync_path(parent.empty() ? "." : parent);
}

void write_file_atomically(const std::string& path, const std::function<void(DurableFile&)>& write,
                           AtPath at_path) {
  std::string temp;
  {
    DurableFile file = DurableFile::temporary_beside(path);
    temp = file.path();
    write(file);
    file.finish();
  }
  const int error = at_path == AtPath::kKeep                    ? rename_no_replace(temp, path)
                    : ::rename(temp.c_str(), path.c_str()) == 0 ? 0
                                                                : errno;
  if (error != 0) {
    ::unlink(temp.c_str());
    if (error == EEXIST && at_path == AtPath::kKeep) {
      throw ConfigError("'" + path + "' appeared while it was being written (another writer?): " +
                        "left as it is, the new content not kept");
    }
    throw_path_error("cannot rename '" + temp + "' to '" + path + "'", error);
  }
  fsync_parent_directory(path);
}

void write_file_atomically(const std::string& path, std::string_view bytes, AtPath at_path) {
  write_file_atomically(
      path, [bytes](DurableFile& file) { file.write(bytes.data(), bytes.size()); }, at_path);
}

void require_can_create_files(const std::string& what, const std::string& dir) {
  std::string probe = dir + "/.mantissa-probe-XXXXXX";
  const int fd = ::mkostemp(probe.data(), O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    throw_error_of_kind(named_path_error_kind(error),
                        what + ": cannot create a file in '" + dir + "': " + std::strerror(error));
  }
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace mantissa::core
