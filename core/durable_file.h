// Files that survive a crash or a power loss whole or not at all: a file's bytes, or a rename
// or new entry in a directory, are durable only once fsync(2) has run on it.
#pragma once

#include <string>
#include <string_view>

namespace mantissa::core {

// fsync(2) of a file or directory by path; throws core::Error naming it.
void fsync_path(const std::string& path);

// fsync(2) of the directory holding `path` (".", when `path` names none): after a rename into
// it or a file created there.
void fsync_parent_directory(const std::string& path);

// Replaces `path` with `bytes`: written to `path`.tmp, synced, renamed over `path`, and the
// directory synced, so that `path` holds either its old or its new content. Throws core::Error
// naming the file and the reason, of the kind core::path_error_kind gives it (the temporary
// file removed, `path` untouched).
void write_file_atomically(const std::string& path, std::string_view bytes);

}  // namespace mantissa::core
