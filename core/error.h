// Errors that carry their context.
//
// Setup and argument errors throw mantissa::core::Error with a message that names the op,
// operand, field or file involved; the launcher prints it and exits non-zero. MANTISSA_CHECK
// builds such a message with stream syntax and adds the source location:
//   MANTISSA_CHECK(a.dim(1) == b.dim(0), "gemm: inner dimensions differ: A " << a.describe());
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace mantissa::core {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

[[noreturn]] void throw_error(const std::string& message, const char* file, int line);

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
