// Warmup + cosine schedule against values worked out from the formula in
// core/optim/lr_schedule.h (peak 1, warmup 10, 110 total steps, floor 0.1 unless stated).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include "core/error.h"
#include "core/optim/lr_schedule.h"

namespace mantissa::core {
namespace {

LrSchedule reference() {
  return LrSchedule({1.0, 10, 110, 0.1});
}

TEST(LrSchedule, LinearWarmupFromTheFirstStep) {
  const LrSchedule s = reference();
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);  // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);  // (4 + 1) / 10
  EXPECT_DOUBLE_EQ(s.at(9), 1.0);  // peak at the last warmup step
}

TEST(LrSchedule, CosineDecayToTheFloor) {
  const LrSchedule s = reference();
  EXPECT_DOUBLE_EQ(s.at(10), 1.0);  // progress 0: cos 0 = 1
  // progress 1/4: 0.1 + 0.45 * (1 + cos(pi/4)) = 0.1 + 0.45 * (1 + sqrt(2)/2)
  EXPECT_NEAR(s.at(35), 0.1 + 0.45 * (1.0 + std::numbers::sqrt2 / 2.0), 1e-15);
  EXPECT_NEAR(s.at(60), 0.55, 1e-15);  // progress 1/2: halfway between peak and floor
  // progress 3/4: 0.1 + 0.45 * (1 - sqrt(2)/2)
  EXPECT_NEAR(s.at(85), 0.1 + 0.45 * (1.0 - std::numbers::sqrt2 / 2.0), 1e-15);
  EXPECT_GT(s.at(109), 0.1);  // the last update of a 110-step run is still above the floor
  EXPECT_DOUBLE_EQ(s.at(110), 0.1);
  EXPECT_DOUBLE_EQ(s.at(100000), 0.1);
}

TEST(LrSchedule, NonIncreasingAfterWarmup) {
  const LrSchedule s = reference();
  for (int64_t step = 10; step < 120; ++step) EXPECT_LE(s.at(step + 1), s.at(step)) << step;
}

TEST(LrSchedule, NoWarmupStartsAtThePeak) {
  const LrSchedule s({3e-4, 0, 100, 0.0});
  EXPECT_DOUBLE_EQ(s.at(0), 3e-4);
  EXPECT_NEAR(s.at(50), 1.5e-4, 1e-18);
  EXPECT_EQ(s.at(100), 0.0);
}

TEST(LrSchedule, AllWarmup) {
  const LrSchedule s({1.0, 4, 4, 0.5});
  EXPECT_DOUBLE_EQ(s.at(0), 0.25);
  EXPECT_DOUBLE_EQ(s.at(3), 1.0);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
}

// A short trial of a config written for a longer run: the ramp takes the whole run.
TEST(LrSchedule, WarmupLongerThanTheRun) {
  const LrSchedule s({1.0, 10, 4, 0.5});
  EXPECT_DOUBLE_EQ(s.at(0), 0.1);
  EXPECT_DOUBLE_EQ(s.at(3), 0.4);
  EXPECT_DOUBLE_EQ(s.at(4), 0.5);
}

TEST(LrSchedule, RejectsBadConfigs) {
  EXPECT_THROW(LrSchedule({1.0, -1, 10, 0.1}), Error);
  EXPECT_THROW(LrSchedule({1.0, 0, 0, 0.1}), Error);
  EXPECT_THROW(LrSchedule({-1.0, 0, 10, 0.1}), Error);
  EXPECT_THROW(LrSchedule({1.0, 0, 10, 1.5}), Error);
  EXPECT_THROW(reference().at(-1), Error);
}

// validate() is the one check of these options: the constructor runs it, and the launcher runs it
// on the config's translation (naming each field by its config path).
TEST(LrSchedule, RejectsBadConfigsNamingFieldValueAndRule) {
  const auto message_for = [](const LrScheduleConfig& c) {
    try {
      LrSchedule schedule(c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message_for({1.0, -1, 10, 0.1}), "lr_schedule.warmup_steps = -1: must be >= 0");
  EXPECT_EQ(message_for({1.0, 0, 0, 0.1}), "lr_schedule.total_steps = 0: must be >= 1");
  EXPECT_EQ(message_for({-1.0, 0, 10, 0.1}), "lr_schedule.lr = -1: must be >= 0");
  EXPECT_EQ(message_for({std::numeric_limits<double>::infinity(), 0, 10, 0.1}),
            "lr_schedule.lr = inf: must be a finite number >= 0");
  EXPECT_EQ(message_for({1.0, 0, 10, 1.5}), "lr_schedule.min_lr_ratio = 1.5: must lie in [0, 1]");
  EXPECT_EQ(message_for({1.0, 10, 10, 1.0}), "");
}

}  // namespace
}  // namespace mantissa::core
