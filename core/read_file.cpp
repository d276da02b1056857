#include "core/read_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "core/error.h"

namespace mantissa::core {
namespace {

// A file the user named and is not there is theirs to fix (path_error_kind leaves ENOENT a
// failure: a writer's missing directory may be made by a retry); the rest as path_error_kind.
ErrorKind read_error_kind(int error) {
  return error == ENOENT ? ErrorKind::kConfig : path_error_kind(error);
}

}  // namespace

std::string read_whole_file(const std::string& path, std::string_view what) {
  const auto fail = [&](ErrorKind kind, const std::string& reason) {
    throw_error_of_kind(kind, std::string(what) + " '" + path + "': " + reason);
  };
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    fail(ErrorKind::kConfig, "is a directory, not a file");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    fail(read_error_kind(error), std::string("cannot open: ") + std::strerror(error));
  }
  std::string bytes;
  try {
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure&) {
    // libstdc++'s filebuf throws a failed read(2) as its own text; errno still says why.
    in.setstate(std::ios::badbit);
  }
  const int error = errno;
  if (in.bad()) fail(read_error_kind(error), std::string("read failed: ") + std::strerror(error));
  return bytes;
}

}  // namespace mantissa::core
