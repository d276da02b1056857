// Durability of files written through streams: a file's bytes, or a rename or new entry in a
// directory, survive a power loss only once fsync(2) has run on it.
#pragma once

#include <string>

namespace mantissa::core {

// fsync(2) of a file or directory by path; throws core::Error naming it.
void fsync_path(const std::string& path);

}  // namespace mantissa::core
