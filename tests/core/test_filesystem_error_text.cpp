// core::filesystem_error_text and error_text: std::filesystem's errors read as mantissa's own, with
// the paths quoted where they belong and the reason last, from errors the library itself throws.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <string>
#include <system_error>

#include "core/error.h"
#include "tests/common/scratch_dir.h"

namespace mantissa::core {
namespace {

namespace fs = std::filesystem;

class FilesystemErrorText : public ::testing::Test {
 protected:
  FilesystemErrorText() { std::ofstream(path("file")) << "in the way"; }
  std::string path(const char* name) const { return dir_.file(name); }

  // The text of the filesystem_error that `call` throws.
  template <typename Call>
  static std::string text_of(Call call) {
    try {
      call();
    } catch (const fs::filesystem_error& e) {
      return filesystem_error_text(e);
    }
    ADD_FAILURE() << "the call threw no filesystem_error";
    return "";
  }

  tests::ScratchDir dir_{"mantissa_fs_error"};
};

TEST_F(FilesystemErrorText, NamesThePathAndThenTheReason) {
  const std::string under_a_file = path("file") + "/checkpoints";
  EXPECT_EQ(text_of([&] { fs::create_directories(under_a_file); }),
            "cannot create directories '" + under_a_file +
                "': " + std::make_error_code(std::errc::not_a_directory).message());
}

TEST_F(FilesystemErrorText, ARenameNamesWhereFromAndWhereTo) {
  const std::string from = path("missing");
  const std::string to = path("step_00000010");
  EXPECT_EQ(text_of([&] { fs::rename(from, to); }),
            "cannot rename '" + from + "' to '" + to +
                "': " + std::make_error_code(std::errc::no_such_file_or_directory).message());
}

// remove_all's second path is the entry it could not remove, not a destination. The error is
// built here as libstdc++'s remove_all throws it for a file in a read-only directory
// (test_checkpoint provokes the real one, as user nobody).
TEST_F(FilesystemErrorText, ARemovalNamesWhereItFailed) {
  const std::string dir = path("step_00000010.removed.tmp");
  const std::string entry = dir + "/held/file";
  const fs::filesystem_error e("cannot remove all", dir, entry,
                               std::make_error_code(std::errc::permission_denied));
  EXPECT_EQ(filesystem_error_text(e),
            "cannot remove all '" + dir + "' (at '" + entry +
                "'): " + std::make_error_code(std::errc::permission_denied).message());
}

TEST_F(FilesystemErrorText, AnErrorWithoutPathsKeepsItsWords) {
  const fs::filesystem_error e("cannot do it", std::make_error_code(std::errc::io_error));
  EXPECT_EQ(filesystem_error_text(e),
            "cannot do it: " + std::make_error_code(std::errc::io_error).message());
}

// error_text words a std::filesystem error so, any other exception as it is.
TEST_F(FilesystemErrorText, ErrorTextRewordsOnlyFilesystemErrors) {
  const std::string from = path("missing");
  try {
    fs::rename(from, path("to"));
    FAIL() << "renamed a missing file";
  } catch (const std::exception& e) {
    EXPECT_EQ(error_text(e),
              "cannot rename '" + from + "' to '" + path("to") +
                  "': " + std::make_error_code(std::errc::no_such_file_or_directory).message());
  }
  EXPECT_EQ(error_text(std::runtime_error("filesystem error: not one")),
            "filesystem error: not one");
}

}  // namespace
}  // namespace mantissa::core
