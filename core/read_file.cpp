#include "core/read_file.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <iterator>

#include "core/error.h"

namespace mantissa::core {
namespace {

[[noreturn]] void fail(ErrorKind kind, std::string_view what, const std::string& path,
                       const std::string& reason) {
  throw_error_of_kind(kind, std::string(what) + " '" + path + "': " + reason);
}

}  // namespace

std::string not_a_file_reason(const std::string& path, NamedPipe pipe) {
  std::error_code ec;  // where status fails (a missing file), opening says why
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  if (ec) return "";
  if (std::filesystem::is_directory(status)) return "is a directory, not a file";
  const bool pipe_taken = pipe == NamedPipe::kReadOnce && std::filesystem::is_fifo(status);
  if (!std::filesystem::is_regular_file(status) && !pipe_taken) {
    return "is not a regular file (a pipe or a device: write it to a file first)";
  }
  return "";
}

std::ifstream open_for_reading(const std::string& path, std::string_view what, NamedPipe pipe) {
  if (const std::string reason = not_a_file_reason(path, pipe); !reason.empty()) {
    fail(ErrorKind::kConfig, what, path, reason);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int error = errno;
    fail(named_path_error_kind(error), what, path,
         std::string("cannot open: ") + std::strerror(error));
  }
  return in;
}

std::string read_whole_file(const std::string& path, std::string_view what, NamedPipe pipe) {
  std::ifstream in = open_for_reading(path, what, pipe);
  std::string bytes;
  try {
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::ios_base::failure&) {
    // libstdc++'s filebuf throws a failed read(2) as its own text; errno still says why.
    in.setstate(std::ios::badbit);
  }
  const int error = errno;
  if (in.bad()) {
    fail(named_path_error_kind(error), what, path,
         std::string("read failed: ") + std::strerror(error));
  }
  return bytes;
}

}  // namespace mantissa::core
