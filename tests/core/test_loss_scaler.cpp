// LossScaler state machine. Every expected value below was worked out by hand from the rules in
// core/precision/loss_scaler.h, one step at a time.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/precision/loss_scaler.h"

namespace mantissa::core {
namespace {

// The core::ConfigError message of `f`, or "" when it does not throw.
template <typename F>
std::string error_message(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

// A small config so that growth, clamping at max and the minimum are all reached in a few steps.
LossScalerConfig small_dynamic() {
  LossScalerConfig c;
  c.init = 8.0;
  c.growth_interval = 3;
  c.hysteresis = 2;
  c.min = 1.0;
  c.max = 32.0;
  c.max_overflows_at_min = 3;
  return c;
}

struct Row {
  bool overflow;  // input; the expected skip decision is the same flag
  float scale;    // expected state after update()
  int64_t growth_tracker;
  int32_t hysteresis_tracker;
  int64_t overflows_at_min;
  int64_t overflow_steps_total;
};

TEST(LossScaler, DynamicStateMachineTable) {
  constexpr bool O = true;   // overflow
  constexpr bool C = false;  // clean
  const std::vector<Row> table = {
      // start: scale 8, growth 0, hysteresis 2
      {O, 8, 0, 1, 0, 1},   // first overflow is tolerated: skip, no backoff
      {C, 8, 1, 1, 0, 1},   // clean steps do not re-arm the hysteresis
      {O, 4, 0, 0, 0, 2},   // second overflow since the start: backoff
      {O, 2, 0, 0, 0, 3},   // tracker stays at 0: every overflow backs off now
      {C, 2, 1, 0, 0, 3},   //
      {C, 2, 2, 0, 0, 3},   //
      {C, 4, 0, 2, 0, 3},   // 3rd clean step: growth, hysteresis re-armed
      {C, 4, 1, 2, 0, 3},   //
      {C, 4, 2, 2, 0, 3},   //
      {C, 8, 0, 2, 0, 3},   // growth
      {C, 8, 1, 2, 0, 3},   //
      {C, 8, 2, 2, 0, 3},   //
      {C, 16, 0, 2, 0, 3},  // growth
      {C, 16, 1, 2, 0, 3},  //
      {C, 16, 2, 2, 0, 3},  //
      {C, 32, 0, 2, 0, 3},  // growth reaches max
      {C, 32, 1, 2, 0, 3},  //
      {C, 32, 2, 2, 0, 3},  //
      {C, 32, 0, 2, 0, 3},  // growth clamped at max; tracker still resets
      {O, 32, 0, 1, 0, 4},  // tolerated
      {C, 32, 1, 1, 0, 4},  //
      {O, 16, 0, 0, 0, 5},  // backoff
      {O, 8, 0, 0, 0, 6},   //
      {O, 4, 0, 0, 0, 7},   //
      {O, 2, 0, 0, 0, 8},   //
      {O, 1, 0, 0, 0, 9},   // backed off to min, but this step ran at 2: not "at min"
      {O, 1, 0, 0, 1, 10},  // ran at min: counted; backoff clamped at min
      {O, 1, 0, 0, 2, 11},  //
      {C, 1, 1, 0, 0, 11},  // a clean step clears the count at min
      {O, 1, 0, 0, 1, 12},  //
      {C, 1, 1, 0, 0, 12},  //
      {C, 1, 2, 0, 0, 12},  //
      {C, 2, 0, 2, 0, 12},  // growth away from the minimum
  };
  LossScaler scaler(small_dynamic());
  ASSERT_EQ(scaler.scale(), 8.0f);
  ASSERT_EQ(scaler.state().hysteresis_tracker, 2);
  for (size_t i = 0; i < table.size(); ++i) {
    const Row& r = table[i];
    SCOPED_TRACE("table row " + std::to_string(i));
    EXPECT_EQ(scaler.update(r.overflow), r.overflow);
    const LossScalerState& s = scaler.state();
    EXPECT_EQ(s.scale, r.scale);
    EXPECT_EQ(scaler.scale(), r.scale);
    EXPECT_EQ(s.growth_tracker, r.growth_tracker);
    EXPECT_EQ(s.hysteresis_tracker, r.hysteresis_tracker);
    EXPECT_EQ(s.overflows_at_min, r.overflows_at_min);
    EXPECT_EQ(s.overflow_steps_total, r.overflow_steps_total);
  }
}

TEST(LossScaler, HysteresisOneBacksOffOnEveryOverflow) {
  LossScalerConfig c = small_dynamic();
  c.hysteresis = 1;
  LossScaler scaler(c);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 4.0f);
  EXPECT_EQ(scaler.state().hysteresis_tracker, 0);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 2.0f);
}

TEST(LossScaler, DefaultsMatchTheDocumentedValues) {
  const LossScalerConfig c;
  EXPECT_EQ(c.mode, LossScaleMode::kDynamic);
  EXPECT_EQ(c.init, 65536.0);
  EXPECT_EQ(c.growth_factor, 2.0);
  EXPECT_EQ(c.backoff_factor, 0.5);
  EXPECT_EQ(c.growth_interval, 2000);
  EXPECT_EQ(c.hysteresis, 2);
  EXPECT_EQ(c.min, 1.0);
  EXPECT_EQ(c.max, 16777216.0);

  LossScaler scaler(c);
  EXPECT_EQ(scaler.scale(), 65536.0f);
  EXPECT_EQ(scaler.inv_scale(), 1.0f / 65536.0f);  // a power of two: exact either way
  for (int i = 0; i < 1999; ++i) ASSERT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 65536.0f);
  EXPECT_EQ(scaler.state().growth_tracker, 1999);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 131072.0f);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
}

TEST(LossScaler, GrowthClampsAtMax) {
  LossScalerConfig c;
  c.init = 16777216.0;  // already at the default max 2^24
  c.growth_interval = 1;
  LossScaler scaler(c);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 16777216.0f);
}

TEST(LossScaler, InvScaleIsTheCorrectlyRoundedReciprocal) {
  LossScalerConfig c;
  c.mode = LossScaleMode::kStatic;
  c.init = 3.0;
  LossScaler scaler(c);
  // The nearest float to 1/3 is 0x3EAAAAAB.
  EXPECT_EQ(scaler.inv_scale(), 0.3333333432674408f);
}

TEST(LossScaler, AbortsAfterConsecutiveOverflowsAtMinimum) {
  LossScalerConfig c = small_dynamic();
  c.init = 1.0;
  LossScaler scaler(c);
  // hysteresis does not matter at the minimum: every overflow here ran at scale 1.
  EXPECT_TRUE(scaler.update(true));
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.state().overflows_at_min, 2);
  try {
    scaler.update(true);
    FAIL() << "expected core::Error at the third consecutive overflow at the minimum";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("loss scale stuck at minimum 1 after 3 consecutive overflowing steps"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("non-finite even unscaled"), std::string::npos) << msg;
    EXPECT_NE(msg.find("lower the learning rate or check the data"), std::string::npos) << msg;
  }
}

TEST(LossScaler, CleanStepResetsTheCountAtMinimum) {
  LossScalerConfig c = small_dynamic();
  c.init = 1.0;
  LossScaler scaler(c);
  for (int round = 0; round < 10; ++round) {
    EXPECT_TRUE(scaler.update(true));
    EXPECT_TRUE(scaler.update(true));
    EXPECT_FALSE(scaler.update(false));
  }
  EXPECT_EQ(scaler.state().overflow_steps_total, 20);
}

TEST(LossScaler, StaticKeepsItsScaleAndSkipsOverflows) {
  LossScalerConfig c;
  c.mode = LossScaleMode::kStatic;
  c.init = 1024.0;
  c.growth_interval = 1;  // ignored in STATIC
  c.max_overflows_at_min = 3;
  LossScaler scaler(c);
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_EQ(scaler.inv_scale(), 1.0f / 1024.0f);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_EQ(scaler.state().growth_tracker, 2);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_EQ(scaler.state().growth_tracker, 0);
  EXPECT_EQ(scaler.state().hysteresis_tracker, 0);
  EXPECT_EQ(scaler.state().overflow_steps_total, 1);
  EXPECT_EQ(scaler.state().overflows_at_min, 1);  // the fixed scale is its own minimum
  EXPECT_TRUE(scaler.update(true));
  try {
    scaler.update(true);
    FAIL() << "expected core::Error at the third consecutive overflow";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("the static loss scale 1024 overflowed 3 consecutive steps — lower "
                       "precision.loss_scale.init (or use DYNAMIC)"),
              std::string::npos)
        << msg;
  }
}

TEST(LossScaler, NoneHasScaleOneAndSkipsOverflows) {
  LossScalerConfig c;
  c.mode = LossScaleMode::kNone;
  c.init = 4096.0;  // ignored in NONE
  LossScaler scaler(c);
  EXPECT_EQ(scaler.scale(), 1.0f);
  EXPECT_EQ(scaler.inv_scale(), 1.0f);
  EXPECT_TRUE(scaler.update(true));
  EXPECT_EQ(scaler.scale(), 1.0f);
  EXPECT_FALSE(scaler.update(false));
  EXPECT_EQ(scaler.scale(), 1.0f);
  EXPECT_EQ(scaler.state().overflow_steps_total, 1);
}

TEST(LossScaler, StateRestoresAndContinuesIdentically) {
  LossScaler a(small_dynamic());
  for (bool overflow : {true, false, true, false, false, false}) a.update(overflow);
  const LossScalerState saved = a.state();

  LossScaler b(small_dynamic());
  EXPECT_FALSE(b.state() == saved);
  b.set_state(saved);
  EXPECT_EQ(b.state(), saved);
  for (bool overflow : {false, true, true, false, false, false, false}) {
    EXPECT_EQ(a.update(overflow), b.update(overflow));
    EXPECT_EQ(a.state(), b.state());
  }
}

TEST(LossScaler, StaticRestoreKeepsTheConfiguredScale) {
  LossScalerConfig c;
  c.mode = LossScaleMode::kStatic;
  c.init = 128.0;
  LossScaler scaler(c);
  LossScalerState s;
  s.scale = 65536.0f;  // e.g. saved by a DYNAMIC run
  s.overflow_steps_total = 7;
  scaler.set_state(s);
  EXPECT_EQ(scaler.scale(), 128.0f);
  EXPECT_EQ(scaler.state().overflow_steps_total, 7);
}

// A resumed run may narrow [min, max]: its dynamic scale goes on from the nearest bound.
TEST(LossScaler, DynamicRestoreClampsTheScaleIntoItsRange) {
  LossScaler scaler(small_dynamic());
  LossScalerState s = scaler.state();
  s.scale = 64.0f;  // above max 32
  s.growth_tracker = 2;
  scaler.set_state(s);
  EXPECT_EQ(scaler.scale(), 32.0f);
  EXPECT_EQ(scaler.state().growth_tracker, 2);
  s.scale = 0.5f;  // below min 1
  scaler.set_state(s);
  EXPECT_EQ(scaler.scale(), 1.0f);
}

// A run resumed with a shorter growth_interval or a smaller hysteresis: clean steps counted
// past the new interval grow the scale at the next clean step (a count of 5 against an
// interval of 3 had frozen it until the next overflow), and no more overflows are tolerated
// than the new hysteresis allows.
TEST(LossScaler, DynamicRestoreFitsTheCountersIntoShorterIntervals) {
  LossScalerConfig longer = small_dynamic();
  longer.growth_interval = 10;
  longer.hysteresis = 4;
  LossScaler before(longer);
  for (int i = 0; i < 5; ++i) before.update(false);
  LossScalerState s = before.state();
  s.hysteresis_tracker = 4;
  ASSERT_EQ(s.growth_tracker, 5);

  LossScaler resumed(small_dynamic());  // growth_interval 3, hysteresis 2
  resumed.set_state(s);
  EXPECT_EQ(resumed.state().growth_tracker, 2);
  EXPECT_EQ(resumed.state().hysteresis_tracker, 2);
  resumed.update(false);
  EXPECT_EQ(resumed.scale(), 16.0f);  // grown from 8 at the first clean step
  resumed.update(false);
  resumed.update(false);
  resumed.update(false);
  EXPECT_EQ(resumed.scale(), 32.0f);  // and every 3 clean steps after it
}

// A BF16 run (kNone, scale 1) resumed in FP16: the fixed scale says nothing about the
// gradients' range, so the dynamic scale starts where a fresh run starts.
TEST(LossScaler, DynamicRestoreAfterAFixedScaleStartsAfresh) {
  LossScalerConfig none;
  none.mode = LossScaleMode::kNone;
  LossScaler bf16(none);
  bf16.update(true);
  bf16.update(false);
  ASSERT_FALSE(bf16.state().dynamic);

  LossScaler fp16(small_dynamic());
  const LossScalerState fresh = fp16.state();
  fp16.set_state(bf16.state());
  LossScalerState want = fresh;
  want.overflow_steps_total = 1;
  EXPECT_EQ(fp16.state(), want);
  EXPECT_EQ(fp16.scale(), 8.0f);
  EXPECT_TRUE(fp16.state().dynamic);
}

TEST(LossScaler, RejectsBadStates) {
  LossScaler scaler(small_dynamic());
  LossScalerState s = scaler.state();
  s.scale = 0.0f;
  EXPECT_THROW(scaler.set_state(s), Error);
  s = scaler.state();
  s.growth_tracker = -1;
  EXPECT_THROW(scaler.set_state(s), Error);
}

// validate() is the one check of these options: the constructor runs it, and the launcher runs it
// on the config's translation (adding "precision." to the path).
TEST(LossScaler, RejectsBadConfigsNamingFieldValueAndRule) {
  auto message_for = [](const LossScalerConfig& c) {
    return error_message([&] { LossScaler scaler(c); });
  };
  LossScalerConfig c = small_dynamic();
  c.growth_factor = 1.0;
  EXPECT_EQ(message_for(c), "loss_scale.growth_factor = 1: must be > 1");
  c = small_dynamic();
  c.backoff_factor = 1.0;
  EXPECT_EQ(message_for(c), "loss_scale.backoff_factor = 1: must lie in (0, 1)");
  c = small_dynamic();
  c.init = 64.0;
  EXPECT_EQ(message_for(c),
            "loss_scale.init = 64: must lie in [min, max] = [1, 32] for a DYNAMIC loss scale");
  c = small_dynamic();
  c.min = 0.0;
  EXPECT_EQ(message_for(c), "loss_scale.min = 0: must be > 0");
  c = small_dynamic();
  c.max = 1e39;
  EXPECT_EQ(message_for(c),
            "loss_scale.max = 1e+39: must lie in [min = 1, 3.4028234663852886e+38]");
  c = small_dynamic();
  c.hysteresis = 0;
  EXPECT_EQ(message_for(c), "loss_scale.hysteresis = 0: must be >= 1");
  c = small_dynamic();
  c.growth_interval = 0;
  EXPECT_EQ(message_for(c), "loss_scale.growth_interval = 0: must be >= 1");
  c = small_dynamic();
  c.max_overflows_at_min = 0;
  EXPECT_EQ(message_for(c), "loss_scale.max_overflows_at_min = 0: must be >= 1");
  c = small_dynamic();
  c.mode = LossScaleMode::kStatic;
  c.init = 1e39;
  EXPECT_EQ(message_for(c),
            "loss_scale.init = 1e+39: is kept as a float: its magnitude must lie in "
            "[1.1754943508222875e-38, 3.4028234663852886e+38]");
  // Below the normal floats the unscaling factor 1 / scale would be inf.
  c.init = 1e-40;
  EXPECT_EQ(message_for(c),
            "loss_scale.init = 1e-40: is kept as a float: its magnitude must lie in "
            "[1.1754943508222875e-38, 3.4028234663852886e+38]");
  c = small_dynamic();
  c.min = 1e-40;
  c.init = 1e-40;
  EXPECT_EQ(message_for(c),
            "loss_scale.min = 1e-40: is kept as a float: its magnitude must lie in "
            "[1.1754943508222875e-38, 3.4028234663852886e+38]");
}

TEST(LossScaler, ChecksEveryFieldWhateverTheMode) {
  LossScalerConfig c;
  c.mode = LossScaleMode::kNone;
  c.growth_factor = 0.5;  // unused without a DYNAMIC scale, still a typo worth reporting
  EXPECT_EQ(error_message([&] { validate(c); }), "loss_scale.growth_factor = 0.5: must be > 1");
  c = LossScalerConfig{};
  c.mode = LossScaleMode::kStatic;
  c.init = 0.5;  // below min: fine for a fixed scale
  EXPECT_EQ(error_message([&] { validate(c); }), "");
}

}  // namespace
}  // namespace mantissa::core
