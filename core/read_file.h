// Reading a whole file a user names (a config, a tokenizer model, a text corpus, a JSON or
// safetensors file) into memory, with one set of errors for every such reader.
#pragma once

#include <string>
#include <string_view>

namespace mantissa::core {

// The bytes of `path`; an empty file gives "" (whether that is wrong is the caller's to say).
// Throws core::Error "<what> '<path>': <reason>": "is a directory, not a file" (a directory
// opens and reads as empty), "cannot open: <errno text>" or "read failed: <errno text>"; a
// config error where the user must fix something (a missing file, no permission: what
// core::path_error_kind counts so, and ENOENT), a failure where a retry may pass (EIO).
std::string read_whole_file(const std::string& path, std::string_view what);

}  // namespace mantissa::core
