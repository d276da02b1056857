#include "core/error.h"

#include <cerrno>
#include <cstring>
#include <string_view>

namespace mantissa::core {
namespace {

std::string without_nul(const std::string& message) {
  std::string out;
  for (const char c : message) {
    if (c == '\0') {
      out += "\\0";
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

Error::Error(const std::string& message) : std::runtime_error(without_nul(message)) {}

void throw_error(const std::string& message, const char* file, int line) {
  const char* base = std::strrchr(file, '/');
  throw Error(message + " [" + (base ? base + 1 : file) + ":" + std::to_string(line) + "]");
}

void throw_error_of_kind(ErrorKind kind, const std::string& message) {
  switch (kind) {
    case ErrorKind::kConfig: throw ConfigError(message);
    case ErrorKind::kDiverged: throw DivergedError(message);
    default: throw Error(message);
  }
}

ErrorKind named_path_error_kind(int error) {
  return error == ENOENT ? ErrorKind::kConfig : path_error_kind(error);
}

ErrorKind path_error_kind(int error) {
  switch (error) {
    case EACCES:
    case EPERM:
    case EROFS:
    case EEXIST:
    case EISDIR:
    case ENOTDIR:
    case ELOOP:
    case ENAMETOOLONG: return ErrorKind::kConfig;
    default: return ErrorKind::kFailure;
  }
}

std::string filesystem_error_text(const std::filesystem::filesystem_error& error) {
  constexpr std::string_view kPrefix = "filesystem error: ";
  const std::string_view what = error.what();
  const std::string reason = ": " + error.code().message();
  const size_t end = what.find(reason);
  if (!what.starts_with(kPrefix) || end == std::string_view::npos) return std::string(what);
  std::string text(what.substr(kPrefix.size(), end - kPrefix.size()));
  if (!error.path1().empty()) text += " '" + error.path1().string() + "'";
  // A rename's or a copy's second path is where to; remove_all's is the entry it failed at.
  const bool to = text.starts_with("cannot rename") || text.starts_with("cannot copy");
  if (!error.path2().empty())
    text += (to ? " to '" : " (at '") + error.path2().string() + (to ? "'" : "')");
  return text + reason;
}

std::string error_text(const std::exception& error) {
  const auto* fs_error = dynamic_cast<const std::filesystem::filesystem_error*>(&error);
  return fs_error ? filesystem_error_text(*fs_error) : error.what();
}

}  // namespace mantissa::core
