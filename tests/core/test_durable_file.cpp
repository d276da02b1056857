// core::write_file_atomically: the file holds its old or its new content, never a part.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/durable_file.h"
#include "core/error.h"
#include "tests/common/scratch_dir.h"

namespace mantissa::core {
namespace {

namespace fs = std::filesystem;

class WriteFileAtomically : public ::testing::Test {
 protected:
  std::string path(const char* name) const { return dir_.file(name); }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

 private:
  tests::ScratchDir dir_{"mantissa_durable"};
};

TEST_F(WriteFileAtomically, ReplacesTheContent) {
  write_file_atomically(path("config.pbtxt"), "old\n");
  write_file_atomically(path("config.pbtxt"), "new\n");
  EXPECT_EQ(read(path("config.pbtxt")), "new\n");
  EXPECT_FALSE(fs::exists(path("config.pbtxt.tmp")));
}

TEST_F(WriteFileAtomically, AnUnfinishedDurableFileIsRemoved) {
  {
    DurableFile kept(path("kept"));
    kept.write("abc", 3);
    kept.finish();
    DurableFile dropped(path("dropped"));
    dropped.write("abc", 3);  // an error unwinds past it before finish()
  }
  EXPECT_EQ(read(path("kept")), "abc");
  EXPECT_FALSE(fs::exists(path("dropped")));
}

TEST_F(WriteFileAtomically, AFullDiskLeavesTheOldContentAndSaysWhy) {
  // The temporary file leads to /dev/full, whose writes fail with ENOSPC.
  write_file_atomically(path("config.pbtxt"), "old\n");
  fs::create_symlink("/dev/full", path("config.pbtxt.tmp"));
  try {
    write_file_atomically(path("config.pbtxt"), "new\n");
    FAIL() << "written";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot write '" + path("config.pbtxt.tmp") + "': No space left on device");
    EXPECT_EQ(e.kind(), ErrorKind::kFailure);
  }
  EXPECT_EQ(read(path("config.pbtxt")), "old\n");
  EXPECT_FALSE(fs::exists(fs::symlink_status(path("config.pbtxt.tmp"))));
}

}  // namespace
}  // namespace mantissa::core
