#include "core/missing_directories.h"

#include <system_error>

namespace mantissa::core {

namespace fs = std::filesystem;

std::vector<fs::path> missing_directories(const fs::path& dir) {
  std::vector<fs::path> missing;
  std::error_code ec;
  const fs::path absolute = fs::absolute(dir, ec);
  if (ec) return missing;
  for (fs::path p = absolute; p != p.parent_path(); p = p.parent_path()) {
    // symlink_status: a name that is there in any form stops the walk (status() follows a
    // symlink, and a dangling one would read as missing).
    if (fs::exists(fs::symlink_status(p, ec))) break;
    if (ec && ec != std::errc::no_such_file_or_directory) break;  // unknowable: claim nothing
    missing.push_back(p);
  }
  return missing;
}

}  // namespace mantissa::core
