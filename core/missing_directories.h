// The directories that creating a path would make, so that a step that fails after making them
// can remove them again and leave the file system as it found it.
#pragma once

#include <filesystem>
#include <vector>

namespace mantissa::core {

// `dir` (made absolute) and each of its ancestors that does not exist, deepest first: what
// std::filesystem::create_directories(dir) would make. A symlink, even a dangling one, exists:
// it is the user's, never a directory to remove.
std::vector<std::filesystem::path> missing_directories(const std::filesystem::path& dir);

}  // namespace mantissa::core
