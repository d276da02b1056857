// Files that survive a crash or a power loss whole or not at all: a file's bytes, or a rename
// or new entry in a directory, are durable only once fsync(2) has run on it.
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <utility>

namespace mantissa::core {

// A file written for keeps: created (or truncated), written, then synced and closed by
// finish(), so that its bytes are on disk before anyone is told it exists; removed again when
// it is not finished (an error unwinds past it). Every failure throws core::Error "cannot
// <create|write> '<path>': <reason>", of the kind core::path_error_kind gives it. A symbolic
// link at `path` is refused (ELOOP), never written through.
class DurableFile {
 public:
  explicit DurableFile(std::string path);
  // A new file beside `path`, named `path`.<pid>-<n>.tmp and created exclusively: whatever
  // is there already (a user's file, a link, another writer's temporary file) is left alone.
  static DurableFile temporary_beside(const std::string& path);
  ~DurableFile();
  DurableFile(const DurableFile&) = delete;
  DurableFile& operator=(const DurableFile&) = delete;

  void write(const void* data, size_t size);
  void finish();
  const std::string& path() const { return path_; }

 private:
  DurableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}

  std::string path_;
  int fd_ = -1;
};

// Whether `name` is a name DurableFile::temporary_beside gives a temporary of `target` (file
// names alone, no directories): "<target>.<digits>-<digits>.tmp".
bool is_temporary_of(std::string_view name, std::string_view target);

// Removes the temporaries of `path` (is_temporary_of) that processes killed while replacing it
// left behind. Only for a file that one process at a time replaces (a run's own files, under
// its run directory's lock): another writer's temporary in progress would go too. A temporary
// that cannot be removed stays (it is only clutter).
void remove_temporaries_of(const std::string& path);

// Removes the temporaries of `path` whose writer, the process their name gives, no longer runs
// on this host: those a writer left when it was killed, for a file any process may write (a
// user's --out). A temporary of a process running here stays. On a file system that hosts
// share, one of another host's process whose pid runs nothing here would go too.
void remove_orphaned_temporaries_of(const std::string& path);

// Throws core::Error "<what>: cannot create a file in '<dir>': <reason>", now rather than after
// long work, when no file can be created in `dir`: creates a file of a new name there (never
// one that exists) and removes it. Permissions, a read-only file system and a directory that
// exists but holds no files (/proc's ENOENT) are config errors: only another path fixes them.
void require_can_create_files(const std::string& what, const std::string& dir);

// Writes all `size` bytes to `fd`, the file `path` (named by the error it throws).
void write_all(int fd, const void* data, size_t size, const std::string& path);

// fsync(2) of a file or directory by path; throws core::Error naming it.
void fsync_path(const std::string& path);

// fsync(2) of the directory holding `path` (".", when `path` names none): after a rename into
// it or a file created there.
void fsync_parent_directory(const std::string& path);

// What write_file_atomically does where `path` names something when it publishes.
enum class AtPath {
  kReplace,  // the new file replaces it
  // It stays, and the call fails: an output the caller found free (a user's --out) that another
  // writer or the user filled while the content was made, maybe for minutes, is never replaced.
  kKeep,
};

// Replaces `path` with what `write` writes into the DurableFile it is given (a temporary file
// beside it, DurableFile::temporary_beside): synced, renamed over `path`, and the directory
// synced, so that `path` holds either its old or its new content. Throws core::Error naming the
// file and the reason, of the kind core::path_error_kind gives it (the temporary file removed,
// `path` untouched); with AtPath::kKeep, a core::ConfigError when `path` names anything by then
// (a dangling symbolic link too).
void write_file_atomically(const std::string& path, const std::function<void(DurableFile&)>& write,
                           AtPath at_path = AtPath::kReplace);
// The same, for content already in memory.
void write_file_atomically(const std::string& path, std::string_view bytes,
                           AtPath at_path = AtPath::kReplace);

}  // namespace mantissa::core
