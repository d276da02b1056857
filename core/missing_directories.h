// Creating a path's directories: the ones it would make, so that a step that fails after making
// them can remove them again and leave the file system as it found it, and why it failed.
#pragma once

#include <filesystem>
#include <string>
#include <system_error>
#include <vector>

namespace mantissa::core {

// `dir` (made absolute) and each of its ancestors that does not exist, deepest first: what
// std::filesystem::create_directories(dir) would make. A symlink, even a dangling one, exists:
// it is the user's, never a directory to remove.
std::vector<std::filesystem::path> missing_directories(const std::filesystem::path& dir);

// Why std::filesystem::create_directories(dir) failed with `error`, for a message. Where a name
// on the way is there but no directory (EEXIST, ENOTDIR), which one and what it is ("'<p>' is a
// symbolic link to '<target>', which names nothing", "'<p>' is a file, not a directory");
// otherwise the error's own text.
std::string create_directories_failure(const std::filesystem::path& dir,
                                       const std::error_code& error);

}  // namespace mantissa::core
