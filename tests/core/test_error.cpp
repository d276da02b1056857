// core::Error's message survives being printed as a C string: a NUL byte from a user's value
// (a path in a config) reads \0 instead of ending the message before its reason.
#include <gtest/gtest.h>

#include <string>

#include "core/error.h"

namespace mantissa::core {
namespace {

TEST(Error, ANulByteIsKeptAsText) {
  const std::string message("run.dir = \"/a\0b\": cannot be created", 35);
  ASSERT_EQ(message.size(), 35u);
  EXPECT_STREQ(ConfigError(message).what(), "run.dir = \"/a\\0b\": cannot be created");
  EXPECT_STREQ(Error("no NUL").what(), "no NUL");
  try {
    throw_error_of_kind(ErrorKind::kDiverged, message);
  } catch (const DivergedError& e) {
    EXPECT_STREQ(e.what(), "run.dir = \"/a\\0b\": cannot be created");
  }
}

}  // namespace
}  // namespace mantissa::core
