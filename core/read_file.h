// Reading a file a user names (a config, a tokenizer model, a text corpus, a JSON or
// safetensors file), with one set of errors for every such reader.
#pragma once

#include <fstream>
#include <string>
#include <string_view>

namespace mantissa::core {

// Whether open_for_reading takes a named pipe (a shell's `<(find ...)`): only a reader that
// reads its input once, to the end, can (a pipe cannot be opened twice or read again).
enum class NamedPipe { kRefused, kReadOnce };

// Why `path` cannot be read as a file a user named, before it is opened: "is a directory, not
// a file" (a directory opens, and libstdc++ reads it as empty or fails at the first read), or
// "is not a regular file (a pipe or a device: ...)" (opening a named pipe waits for a writer,
// /dev/zero would be read for ever; a named pipe passes with NamedPipe::kReadOnce). "" for a
// regular file, and where the path's status cannot be read (opening it says why).
std::string not_a_file_reason(const std::string& path, NamedPipe pipe = NamedPipe::kRefused);

// `path` opened for reading (binary). Throws core::Error "<what> '<path>': <reason>":
//  - not_a_file_reason's, a config error;
//  - "cannot open: <errno text>": a config error where the user must fix something (a
//    missing file, no permission: ENOENT and what core::path_error_kind counts so), a
//    failure where a retry may pass.
std::ifstream open_for_reading(const std::string& path, std::string_view what,
                               NamedPipe pipe = NamedPipe::kRefused);

// The bytes of `path`, opened as open_for_reading does; an empty file gives "" (whether that is
// wrong is the caller's to say). A failed read throws "<what> '<path>': read failed: <errno
// text>", a failure (exit 1) for an I/O error.
std::string read_whole_file(const std::string& path, std::string_view what,
                            NamedPipe pipe = NamedPipe::kRefused);

}  // namespace mantissa::core
