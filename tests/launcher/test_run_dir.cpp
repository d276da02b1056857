// The run directory's lock (RunDirLock) and the removal of what a failed start made
// (RunDirCleanup): two runs started on one run.dir at the same moment leave one of them running
// with the lock file in place, whichever fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

#include "core/error.h"
#include "launcher/run_dir_cleanup.h"
#include "launcher/run_dir_lock.h"
#include "tests/common/scratch_dir.h"

namespace mantissa::launcher {
namespace {

namespace fs = std::filesystem;

class RunDir : public ::testing::Test {
 protected:
  const tests::ScratchDir scratch_{"run_dir"};
  const fs::path root_{scratch_.path()};
};

TEST_F(RunDir, ASecondLockIsRefusedNamingTheHolder) {
  const std::string dir = root_.string();
  const RunDirLock held(dir);
  try {
    const RunDirLock second(dir);
    FAIL() << "a second lock on one run.dir was taken";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\": another run is using it (pid " +
                                         std::to_string(::getpid()) + " on "),
              std::string::npos)
        << e.what();
  }
}

TEST_F(RunDir, AFailedStartRemovesTheDirectoryItMadeAndItsParents) {
  const fs::path dir = root_ / "runs" / "a";
  {
    std::optional<RunDirLock> lock;  // the Trainer's order: the cleanup ends first, locked
    RunDirCleanup cleanup(dir.string(), true);
    fs::create_directories(dir / "log");
    lock.emplace(dir.string());
    cleanup.locked();
  }
  EXPECT_FALSE(fs::exists(root_ / "runs"));
}

TEST_F(RunDir, ARunThatLosesTheLockRemovesNothing) {
  // Both starts find run.dir missing, so each would count it as its own to remove. The winner
  // holds the lock; the loser's refusal must leave the lock file, and with it the directory.
  const fs::path dir = root_ / "runs" / "a";
  RunDirCleanup winner_cleanup(dir.string(), true);
  std::optional<RunDirCleanup> loser_cleanup(std::in_place, dir.string(), true);
  fs::create_directories(dir);
  const RunDirLock winner(dir.string());
  winner_cleanup.locked();
  EXPECT_THROW(RunDirLock{dir.string()}, core::ConfigError);
  loser_cleanup.reset();
  EXPECT_TRUE(fs::exists(dir / kRunDirLockFile));
  // The winner still holds the lock: a third start is refused.
  EXPECT_THROW(RunDirLock{dir.string()}, core::ConfigError);
  winner_cleanup.keep();
}

}  // namespace
}  // namespace mantissa::launcher
