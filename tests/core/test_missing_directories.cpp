// core::missing_directories: what creating a path would make, deepest first, never a name the
// user already has (a dangling symlink included); core::create_directories_failure: which name
// on the way stopped it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <vector>

#include "core/missing_directories.h"
#include "tests/common/scratch_dir.h"

namespace mantissa::core {
namespace {

namespace fs = std::filesystem;

class MissingDirectories : public ::testing::Test {
 protected:
  const tests::ScratchDir scratch_{"missing_directories"};
  const fs::path root_{scratch_.path()};
};

TEST_F(MissingDirectories, AreThePathAndItsMissingAncestorsDeepestFirst) {
  EXPECT_EQ(missing_directories(root_ / "a" / "b"),
            (std::vector<fs::path>{root_ / "a" / "b", root_ / "a"}));
  EXPECT_EQ(missing_directories(root_), std::vector<fs::path>{});
  fs::create_directory(root_ / "a");
  EXPECT_EQ(missing_directories(root_ / "a" / "b"), std::vector<fs::path>{root_ / "a" / "b"});
}

TEST_F(MissingDirectories, ARelativePathIsMadeAbsolute) {
  const fs::path cwd = fs::current_path();
  fs::current_path(root_);
  const std::vector<fs::path> missing = missing_directories("x/y");
  fs::current_path(cwd);
  EXPECT_EQ(missing, (std::vector<fs::path>{root_ / "x" / "y", root_ / "x"}));
}

TEST_F(MissingDirectories, ADanglingSymlinkIsTheUsersNotMissing) {
  fs::create_symlink(root_ / "nowhere", root_ / "link");
  ASSERT_FALSE(fs::exists(root_ / "link"));  // status() follows it: it reads as missing
  EXPECT_EQ(missing_directories(root_ / "link" / "run"),
            std::vector<fs::path>{root_ / "link" / "run"});
  EXPECT_EQ(missing_directories(root_ / "link"), std::vector<fs::path>{});
}

TEST_F(MissingDirectories, AFailureNamesTheNameOnTheWayThatIsNoDirectory) {
  const auto failure = [](const fs::path& dir) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    EXPECT_TRUE(ec) << dir;
    return create_directories_failure(dir, ec);
  };
  fs::create_symlink(root_ / "nowhere", root_ / "dangling");
  EXPECT_EQ(failure(root_ / "dangling" / "run"),
            "'" + (root_ / "dangling").string() + "' is a symbolic link to '" +
                (root_ / "nowhere").string() + "', which names nothing");
  EXPECT_EQ(failure(root_ / "dangling"),
            "'" + (root_ / "dangling").string() + "' is a symbolic link to '" +
                (root_ / "nowhere").string() + "', which names nothing");
  std::ofstream(root_ / "notes.txt") << "x";
  EXPECT_EQ(failure(root_ / "notes.txt" / "run"),
            "'" + (root_ / "notes.txt").string() + "' is a file, not a directory");
  fs::create_symlink(root_ / "notes.txt", root_ / "to_file");
  EXPECT_EQ(failure(root_ / "to_file" / "run"),
            "'" + (root_ / "to_file").string() + "' is a symbolic link to '" +
                (root_ / "notes.txt").string() + "', not a directory");
  // Another error keeps its own text.
  EXPECT_EQ(create_directories_failure(root_, std::make_error_code(std::errc::permission_denied)),
            std::make_error_code(std::errc::permission_denied).message());
}

}  // namespace
}  // namespace mantissa::core
