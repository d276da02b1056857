// Errors that carry their context and their kind.
//
// Setup and argument errors throw mantissa::core::Error (or one of its kinds below) with a
// message that names the op, operand, field or file involved; the launcher prints it and
// exits with the kind's code. Two macros build such a message with stream syntax:
// - MANTISSA_CHECK, for what only a defect of mantissa can break (an op's shape contract, an
//   internal invariant): the message ends with the source location, for the bug report.
//     MANTISSA_CHECK(a.dim(1) == b.dim(0), "gemm: inner dimensions differ: A " << a.describe());
// - MANTISSA_REQUIRE, for what the user's input or machine can break, with the kind that
//   decides the exit code: kConfig for input that is wrong (a malformed shard, a checkpoint of
//   another model: a retry fails again), kFailure for an environment that fails (a full disk, a
//   file that cannot be created: a retry may succeed). The message says it all, without a
//   source location.
//     MANTISSA_REQUIRE(fd >= 0, kFailure, "cannot create '" << path << "': " << strerror(errno));
#pragma once

#include <filesystem>
#include <sstream>
#include <stdexcept>
#include <string>

namespace mantissa::core {

// What kind of failure ended a run. The values are the mantissa executable's exit codes
// (README.md, `mantissa train --help`); scripts and Slurm wrappers rely on them: after
// kConfig or kDiverged a retry fails again, after kFailure or kPeerLost it may not.
enum class ErrorKind {
  // A runtime failure: I/O, communication, a checkpoint that could not be written or read.
  kFailure = 1,
  // A bad command line or configuration (including data files and devices it names, and a
  // checkpoint in its run directory that does not fit it): nothing was trained, except where a
  // token shard holds a token past the vocabulary or is cut while the run reads it, which is
  // found when a batch reads it.
  kConfig = 2,
  // A peer rank stopped answering within dist.timeout_s: the rank that noticed ends the job,
  // naming the silent ranks (dist::World::abort_on_timeout).
  kPeerLost = 3,
  // Training diverged: a non-finite loss, or gradients non-finite even at the minimum loss
  // scale for precision.loss_scale.max_overflows_at_min steps in a row.
  kDiverged = 4,
};

constexpr int exit_code(ErrorKind kind) {
  return static_cast<int>(kind);
}

class Error : public std::runtime_error {
 public:
  // A NUL byte in the message (from a path or value a user wrote) is kept as the text \0:
  // what() is printed as a C string, which would end there, before the reason.
  explicit Error(const std::string& message);
  explicit Error(const char* message) : Error(std::string(message)) {}
  virtual ErrorKind kind() const { return ErrorKind::kFailure; }
};

// Raised where a config field, a command-line argument or an input file named by them is
// wrong. The message names the field (or file) and the rule.
class ConfigError : public Error {
 public:
  using Error::Error;
  ErrorKind kind() const override { return ErrorKind::kConfig; }
};

// An allocation the host or the device could not satisfy (a failure, exit 1): the launcher adds
// the settings that size memory.
class OutOfMemory : public Error {
 public:
  using Error::Error;
};

// Raised identically on every rank when training cannot go on (every rank sees the same
// MAX-reduced overflow flag and the same mean loss).
class DivergedError : public Error {
 public:
  using Error::Error;
  ErrorKind kind() const override { return ErrorKind::kDiverged; }
};

[[noreturn]] void throw_error(const std::string& message, const char* file, int line);
// Throws the class of `kind`: ConfigError for kConfig, DivergedError for kDiverged, else Error.
[[noreturn]] void throw_error_of_kind(ErrorKind kind, const std::string& message);

// The kind of a failure (errno `error`) to create, open or write a path a user named: kConfig
// for what the user must change (no permission, a read-only file system, something else in the
// path's place), kFailure for what may pass on a retry (a full disk or quota, an I/O error).
ErrorKind path_error_kind(int error);
// path_error_kind, with ENOENT a config error too (path_error_kind leaves it a failure: a
// writer's missing directory may be made by a retry): for a path a user named that must exist
// (a file to read), or whose parent exists (a file or directory to create, where ENOENT says
// that the file system there holds none: /proc).
ErrorKind named_path_error_kind(int error);

// A std::filesystem error worded as mantissa's own: libstdc++'s "filesystem error: cannot
// rename: Permission denied [a] [b]" reads "cannot rename 'a' to 'b': Permission denied" (the
// second path of a rename or copy is its destination; of another operation, such as remove_all,
// where it failed: "cannot remove all 'a' (at 'a/b'): ..."). Any other form is left as what()
// has it.
std::string filesystem_error_text(const std::filesystem::filesystem_error& error);
// What an exception says: filesystem_error_text for a std::filesystem error, what() otherwise.
std::string error_text(const std::exception& error);

}  // namespace mantissa::core

#define MANTISSA_CHECK(condition, message_stream)                                      \
  do {                                                                                 \
    if (!(condition)) {                                                                \
      std::ostringstream mantissa_check_message;                                       \
      mantissa_check_message << message_stream;                                        \
      ::mantissa::core::throw_error(mantissa_check_message.str(), __FILE__, __LINE__); \
    }                                                                                  \
  } while (0)

#define MANTISSA_FAIL(message_stream) MANTISSA_CHECK(false, message_stream)

#define MANTISSA_REQUIRE(condition, kind, message_stream)                      \
  do {                                                                         \
    if (!(condition)) {                                                        \
      std::ostringstream mantissa_require_message;                             \
      mantissa_require_message << message_stream;                              \
      ::mantissa::core::throw_error_of_kind(::mantissa::core::ErrorKind::kind, \
                                            mantissa_require_message.str());   \
    }                                                                          \
  } while (0)
