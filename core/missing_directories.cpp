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

std::string create_directories_failure(const fs::path& dir, const std::error_code& error) {
  if (error != std::errc::file_exists && error != std::errc::not_a_directory) {
    return error.message();
  }
  std::error_code ec;
  fs::path p;
  for (const fs::path& part : fs::absolute(dir, ec)) {
    p /= part;
    const fs::file_status own = fs::symlink_status(p, ec);
    if (!fs::exists(own)) break;
    const fs::file_status target = fs::status(p, ec);
    if (fs::is_directory(target)) continue;
    std::string why = "'";
    why += p.string();
    if (!fs::is_symlink(own)) {
      why += "' is a file, not a directory";
      return why;
    }
    why += "' is a symbolic link to '";
    why += fs::read_symlink(p, ec).string();
    why += fs::exists(target) ? "', not a directory" : "', which names nothing";
    return why;
  }
  return error.message();
}

}  // namespace mantissa::core
