// FP8 scaling recipes. Expected scales are fp8_max / amax / 2^margin worked out by hand, with
// amaxes chosen so that the quotients are exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops/backend.h"
#include "core/precision/fp8_scaling.h"

namespace mantissa::core {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

Fp8ScalingConfig delayed(int history_len, AmaxCompute compute, int margin = 0) {
  Fp8ScalingConfig c;
  c.recipe = Fp8Recipe::kDelayed;
  c.amax_history_len = history_len;
  c.amax_compute = compute;
  c.margin = margin;
  return c;
}

// One step of a registry holding one tensor; returns its new scale.
float step(Fp8ScalingRegistry& registry, float amax) {
  registry.update(std::vector<float>{amax});
  return registry.tensor(0).scale;
}

TEST(Fp8Scaling, FormatMaxima) {
  EXPECT_EQ(fp8_max(DType::kE4M3), 448.0f);
  EXPECT_EQ(fp8_max(DType::kE5M2), 57344.0f);
  EXPECT_THROW(fp8_max(DType::kBF16), Error);
}

TEST(Fp8Scaling, ScaleFromAmax) {
  EXPECT_EQ(fp8_scale_from_amax(2.0f, 1.0f, 448.0f, 0), 224.0f);
  EXPECT_EQ(fp8_scale_from_amax(2.0f, 1.0f, 448.0f, 1), 112.0f);
  EXPECT_EQ(fp8_scale_from_amax(7.0f, 1.0f, 57344.0f, 2), 2048.0f);  // 57344/7 = 8192, /4
  EXPECT_EQ(fp8_scale_from_amax(0.0f, 5.0f, 448.0f, 0), 5.0f);       // keeps the old scale
  EXPECT_EQ(fp8_scale_from_amax(kInf, 5.0f, 448.0f, 0), 5.0f);
  EXPECT_EQ(fp8_scale_from_amax(kNaN, 5.0f, 448.0f, 0), 5.0f);
  // A tiny positive amax is floored at 1e-12: the scale is 448e12 rounded once to float.
  EXPECT_EQ(fp8_scale_from_amax(1e-20f, 1.0f, 448.0f, 0), static_cast<float>(4.48e14));
  // 448/3 is not exact: the nearest float to 149.333...
  EXPECT_EQ(fp8_scale_from_amax(3.0f, 1.0f, 448.0f, 0), 149.3333282470703f);
  EXPECT_THROW(fp8_scale_from_amax(-1.0f, 1.0f, 448.0f, 0), Error);
}

TEST(Fp8Scaling, NewTensorHasUnitScaleAndEmptyHistory) {
  Fp8ScalingRegistry registry(delayed(4, AmaxCompute::kMax));
  EXPECT_EQ(registry.add("h0.qkv.weight", DType::kE4M3), 0);
  const Fp8TensorState& t = registry.tensor(0);
  EXPECT_EQ(t.name, "h0.qkv.weight");
  EXPECT_EQ(t.scale, 1.0f);
  EXPECT_EQ(t.scale_inv, 1.0f);
  EXPECT_EQ(t.amax_history, std::vector<float>(4, 0.0f));
  // A step that saw nothing (amax 0) keeps the scale.
  EXPECT_EQ(step(registry, 0.0f), 1.0f);
}

TEST(Fp8Scaling, DelayedMaxOverHistoryWithRingWrap) {
  Fp8ScalingRegistry registry(delayed(4, AmaxCompute::kMax));
  registry.add("w", DType::kE4M3);
  // amax sequence and the history maximum after each step (window of the last 4):
  EXPECT_EQ(step(registry, 2.0f), 224.0f);  // [2]           max 2
  EXPECT_EQ(step(registry, 8.0f), 56.0f);   // [2 8]         max 8
  EXPECT_EQ(step(registry, 4.0f), 56.0f);   // [2 8 4]       max 8
  EXPECT_EQ(step(registry, 1.0f), 56.0f);   // [2 8 4 1]     max 8
  EXPECT_EQ(step(registry, 0.5f), 56.0f);   // [8 4 1 .5]    max 8 (2 dropped)
  EXPECT_EQ(step(registry, 0.5f), 112.0f);  // [4 1 .5 .5]   max 4 (8 dropped)
  EXPECT_EQ(step(registry, 0.5f), 448.0f);  // [1 .5 .5 .5]  max 1
  EXPECT_EQ(step(registry, 0.5f), 896.0f);  // [.5 .5 .5 .5] max .5
  EXPECT_EQ(registry.tensor(0).scale_inv, 1.0f / 896.0f);
  // 8 steps in a ring of 4: the next write goes to slot 0 again.
  EXPECT_EQ(registry.tensor(0).history_next, 0);
  EXPECT_EQ(registry.newest_amax(0), 0.5f);
}

TEST(Fp8Scaling, DelayedMostRecent) {
  Fp8ScalingRegistry registry(delayed(4, AmaxCompute::kMostRecent));
  registry.add("w", DType::kE4M3);
  EXPECT_EQ(step(registry, 2.0f), 224.0f);
  EXPECT_EQ(step(registry, 8.0f), 56.0f);
  EXPECT_EQ(step(registry, 4.0f), 112.0f);
  EXPECT_EQ(step(registry, 0.0f), 112.0f);   // amax 0: old scale kept
  EXPECT_EQ(registry.newest_amax(0), 0.0f);  // ... but the 0 is recorded
}

TEST(Fp8Scaling, MarginAndE5M2) {
  Fp8ScalingRegistry registry(delayed(2, AmaxCompute::kMax, /*margin=*/2));
  registry.add("grad", DType::kE5M2);
  EXPECT_EQ(step(registry, 7.0f), 2048.0f);  // 57344 / 7 / 4
  EXPECT_EQ(registry.tensor(0).scale_inv, 1.0f / 2048.0f);
}

TEST(Fp8Scaling, NonFiniteAmaxLeavesTheTensorUntouched) {
  Fp8ScalingRegistry registry(delayed(4, AmaxCompute::kMax));
  registry.add("w", DType::kE4M3);
  step(registry, 2.0f);
  const Fp8TensorState before = registry.tensor(0);
  EXPECT_EQ(step(registry, kInf), 224.0f);
  EXPECT_EQ(registry.tensor(0), before);
  EXPECT_EQ(step(registry, kNaN), 224.0f);
  EXPECT_EQ(registry.tensor(0), before);
  // The next finite amax carries on from the untouched history: [2 8] -> max 8.
  EXPECT_EQ(step(registry, 8.0f), 56.0f);
}

TEST(Fp8Scaling, CurrentUsesThisStepsAmaxOnly) {
  Fp8ScalingConfig c = delayed(4, AmaxCompute::kMax);  // amax_compute is ignored by CURRENT
  c.recipe = Fp8Recipe::kCurrent;
  Fp8ScalingRegistry registry(c);
  registry.add("x", DType::kE4M3);
  EXPECT_EQ(step(registry, 2.0f), 224.0f);
  EXPECT_EQ(step(registry, 8.0f), 56.0f);
  EXPECT_EQ(step(registry, 4.0f), 112.0f);  // a MAX history would still say 8
  EXPECT_EQ(step(registry, 0.0f), 112.0f);
  EXPECT_EQ(step(registry, kInf), 112.0f);
}

TEST(Fp8Scaling, OneAmaxPerTensorInRegistrationOrder) {
  Fp8ScalingRegistry registry(delayed(4, AmaxCompute::kMostRecent));
  EXPECT_EQ(registry.add("a", DType::kE4M3), 0);
  EXPECT_EQ(registry.add("b", DType::kE5M2), 1);
  EXPECT_EQ(registry.size(), 2);
  registry.update(std::vector<float>{4.0f, 8.0f});
  EXPECT_EQ(registry.tensor(0).scale, 112.0f);   // 448 / 4
  EXPECT_EQ(registry.tensor(1).scale, 7168.0f);  // 57344 / 8
  EXPECT_THROW(registry.update(std::vector<float>{1.0f}), Error);
  // A negative amax is a bug upstream: rejected before any tensor changes.
  const Fp8ScalingState before = registry.state();
  EXPECT_THROW(registry.update(std::vector<float>{1.0f, -1.0f}), Error);
  EXPECT_EQ(registry.state(), before);
}

// Two ranks see different amaxes; after an element-wise MAX of their flat buffers (what the
// all-reduce does) both compute the same states.
TEST(Fp8Scaling, FlatBufferMaxReduceGivesIdenticalStatesOnAllRanks) {
  const Fp8ScalingConfig c = delayed(8, AmaxCompute::kMax);
  Fp8ScalingRegistry rank0(c), rank1(c);
  for (Fp8ScalingRegistry* r : {&rank0, &rank1}) {
    r->add("h0.fc.weight", DType::kE4M3);
    r->add("h0.fc.input", DType::kE4M3);
    r->add("h0.fc.grad_output", DType::kE5M2);
  }
  const std::vector<float> amax0 = {1.0f, 16.0f, 2.0f};
  const std::vector<float> amax1 = {1.0f, 4.0f, 14.0f};
  std::vector<float> reduced(3);
  for (int i = 0; i < 3; ++i) reduced[i] = std::max(amax0[i], amax1[i]);
  rank0.update(reduced);
  rank1.update(reduced);
  EXPECT_EQ(rank0.state(), rank1.state());
  EXPECT_EQ(rank0.tensor(0).scale, 448.0f);   // 448 / 1
  EXPECT_EQ(rank0.tensor(1).scale, 28.0f);    // 448 / 16
  EXPECT_EQ(rank0.tensor(2).scale, 4096.0f);  // 57344 / 14
}

TEST(Fp8Scaling, StateRoundTripAndContinuation) {
  const Fp8ScalingConfig c = delayed(3, AmaxCompute::kMax, 1);
  Fp8ScalingRegistry a(c);
  a.add("w", DType::kE4M3);
  a.add("g", DType::kE5M2);
  for (float amax : {3.0f, 5.0f, 0.25f, 2.0f}) a.update(std::vector<float>{amax, amax * 10.0f});
  Fp8ScalingRegistry b(c);
  b.add("w", DType::kE4M3);
  b.add("g", DType::kE5M2);
  EXPECT_FALSE(b.state() == a.state());
  b.set_state(a.state());
  EXPECT_EQ(b.state(), a.state());
  for (float amax : {1.0f, 0.5f, 0.125f}) {
    for (Fp8ScalingRegistry* r : {&a, &b}) r->update(std::vector<float>{amax, amax});
    EXPECT_EQ(a.state(), b.state());
  }
}

TEST(Fp8Scaling, RejectsMismatchedStateNamingTheTensor) {
  const Fp8ScalingConfig c = delayed(4, AmaxCompute::kMax);
  Fp8ScalingRegistry a(c);
  a.add("w", DType::kE4M3);
  Fp8ScalingRegistry other_name(c);
  other_name.add("v", DType::kE4M3);
  try {
    a.set_state(other_name.state());
    FAIL() << "expected core::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'v'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(a.set_state(Fp8ScalingState{}), Error);
}

// A resume may change amax_history_len: the newest amaxes carry over, oldest first.
TEST(Fp8Scaling, RestoredHistoriesKeepTheirNewestEntriesInAnotherLength) {
  Fp8ScalingRegistry saved(delayed(4, AmaxCompute::kMax));
  saved.add("w", DType::kE4M3);
  // Six steps through a ring of 4: it holds [5 6 3 4], the next slot 2.
  for (float amax : {1.0f, 2.0f, 3.0f, 4.0f, 5.0f, 6.0f}) saved.update(std::vector<float>{amax});
  ASSERT_EQ(saved.tensor(0).amax_history, (std::vector<float>{5, 6, 3, 4}));
  ASSERT_EQ(saved.tensor(0).history_next, 2);

  Fp8ScalingRegistry shorter(delayed(2, AmaxCompute::kMax));
  shorter.add("w", DType::kE4M3);
  shorter.set_state(saved.state());
  EXPECT_EQ(shorter.tensor(0).amax_history, (std::vector<float>{5, 6}));
  EXPECT_EQ(shorter.tensor(0).history_next, 0);
  EXPECT_EQ(shorter.newest_amax(0), 6.0f);
  EXPECT_EQ(shorter.tensor(0).scale, saved.tensor(0).scale);
  // The next step's window is the newest 2 of [5 6 1]: the 5 has left it.
  shorter.update(std::vector<float>{1.0f});
  EXPECT_EQ(shorter.tensor(0).amax_history, (std::vector<float>{1, 6}));
  EXPECT_EQ(shorter.tensor(0).scale, fp8_scale_from_amax(6.0f, 1.0f, 448.0f, 0));

  Fp8ScalingRegistry longer(delayed(6, AmaxCompute::kMax));
  longer.add("w", DType::kE4M3);
  longer.set_state(saved.state());
  EXPECT_EQ(longer.tensor(0).amax_history, (std::vector<float>{3, 4, 5, 6, 0, 0}));
  EXPECT_EQ(longer.tensor(0).history_next, 4);
  EXPECT_EQ(longer.newest_amax(0), 6.0f);
}

TEST(Fp8Scaling, RejectsBadRegistrationsAndConfigs) {
  Fp8ScalingRegistry registry(delayed(4, AmaxCompute::kMax));
  registry.add("w", DType::kE4M3);
  EXPECT_THROW(registry.add("w", DType::kE5M2), Error);
  EXPECT_THROW(registry.add("x", DType::kBF16), Error);
  EXPECT_THROW(registry.tensor(1), Error);
  EXPECT_THROW(Fp8ScalingRegistry(delayed(0, AmaxCompute::kMax)), Error);
  EXPECT_THROW(Fp8ScalingRegistry(delayed(4, AmaxCompute::kMax, -1)), Error);
}

// validate() is the one check of these options: the constructor runs it, and the launcher runs it
// on the config's translation (adding "precision." to the path).
TEST(Fp8Scaling, RejectsBadConfigsNamingFieldValueAndRule) {
  const auto message_for = [](const Fp8ScalingConfig& c) {
    try {
      Fp8ScalingRegistry registry(c);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_EQ(message_for(delayed(0, AmaxCompute::kMax)),
            "fp8.amax_history_len = 0: must lie in [1, 1048576]");
  EXPECT_EQ(message_for(delayed((1 << 20) + 1, AmaxCompute::kMax)),
            "fp8.amax_history_len = 1048577: must lie in [1, 1048576]");
  EXPECT_EQ(message_for(delayed(4, AmaxCompute::kMax, -1)), "fp8.margin = -1: must lie in [0, 14]");
  EXPECT_EQ(message_for(delayed(4, AmaxCompute::kMax, 15)), "fp8.margin = 15: must lie in [0, 14]");
  EXPECT_EQ(message_for(delayed(1 << 20, AmaxCompute::kMax, 14)), "");
}

}  // namespace
}  // namespace mantissa::core

namespace mantissa::core {
namespace {

// The block recipes' options, and each refusal naming its field.
void expect_config_error(const Fp8ScalingConfig& c, const std::string& field) {
  try {
    validate(c);
    ADD_FAILURE() << "expected a ConfigError naming " << field;
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()).rfind(field + " = ", 0), 0u) << e.what();
  }
}

TEST(Fp8Recipes, BlockRecipeOptionsAreValidated) {
  Fp8ScalingConfig c;
  c.recipe = Fp8Recipe::kBlockwise;
  c.grad_format = DType::kE4M3;
  EXPECT_NO_THROW(validate(c));
  c.power_of_two = true;
  EXPECT_NO_THROW(validate(c));
  c.margin = 1;
  expect_config_error(c, "fp8.margin");
  c = Fp8ScalingConfig{};
  c.recipe = Fp8Recipe::kRowwise;
  c.grad_format = DType::kE5M2;
  expect_config_error(c, "fp8.grad_format");
  c.grad_format = DType::kBF16;
  expect_config_error(c, "fp8.grad_format");
  c = Fp8ScalingConfig{};
  c.recipe = Fp8Recipe::kMxfp8;
  expect_config_error(c, "fp8.power_of_two_scales");
  c.power_of_two = true;
  EXPECT_NO_THROW(validate(c));
  c = Fp8ScalingConfig{};
  c.power_of_two = true;  // DELAYED
  expect_config_error(c, "fp8.power_of_two_scales");
}

TEST(Fp8Recipes, ScaleModesPerRole) {
  EXPECT_EQ(fp8_scale_mode(Fp8Recipe::kBlockwise, Fp8Role::kInput), ScaleMode::kVec128);
  EXPECT_EQ(fp8_scale_mode(Fp8Recipe::kBlockwise, Fp8Role::kGradient), ScaleMode::kVec128);
  EXPECT_EQ(fp8_scale_mode(Fp8Recipe::kBlockwise, Fp8Role::kWeight), ScaleMode::kBlock128);
  for (Fp8Role role : {Fp8Role::kInput, Fp8Role::kWeight, Fp8Role::kGradient}) {
    EXPECT_EQ(fp8_scale_mode(Fp8Recipe::kRowwise, role), ScaleMode::kOuterVec);
    EXPECT_EQ(fp8_scale_mode(Fp8Recipe::kMxfp8, role), ScaleMode::kVec32Ue8m0);
    EXPECT_EQ(fp8_scale_mode(Fp8Recipe::kDelayed, role), ScaleMode::kTensor);
    EXPECT_EQ(fp8_scale_mode(Fp8Recipe::kCurrent, role), ScaleMode::kTensor);
  }
  // The pairs a Linear layer multiplies are pairs cuBLASLt defines.
  for (Fp8Recipe r : {Fp8Recipe::kBlockwise, Fp8Recipe::kRowwise, Fp8Recipe::kMxfp8}) {
    EXPECT_EQ(scale_mode_pair_rule(fp8_scale_mode(r, Fp8Role::kInput),
                                   fp8_scale_mode(r, Fp8Role::kWeight)),
              nullptr);
    EXPECT_EQ(scale_mode_pair_rule(fp8_scale_mode(r, Fp8Role::kGradient),
                                   fp8_scale_mode(r, Fp8Role::kWeight)),
              nullptr);
    EXPECT_EQ(scale_mode_pair_rule(fp8_scale_mode(r, Fp8Role::kGradient),
                                   fp8_scale_mode(r, Fp8Role::kInput)),
              nullptr);
  }
}

// Backend::fp8_scale_from_amax (the device side of CURRENT scaling) against FP64 arithmetic:
// scale = fmax / max(amax, 1e-12) / 2^margin rounded once, 1 / scale rounded once, and the old
// scale kept for a zero, infinite or NaN amax.
TEST(Fp8Scaling, BackendScaleFromAmaxIsTheFp64Rule) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  Tensor amax = Tensor::empty(Shape{1}, DType::kF32);
  Tensor scale = Tensor::empty(Shape{1}, DType::kF32);
  Tensor scale_inv = Tensor::empty(Shape{1}, DType::kF32);
  const float amaxes[] = {3.5f, 448.0f, 1e-30f, 1e-12f, 7e-13f, 2.5e30f, 0.0f, kInf, kNaN};
  for (const DType format : {DType::kE4M3, DType::kE5M2}) {
    for (const int margin : {0, 3}) {
      for (const float a : amaxes) {
        SCOPED_TRACE(std::string(dtype_name(format)) + " margin " + std::to_string(margin) +
                     " amax " + std::to_string(a));
        const float old_scale = 0.625f;
        amax.data_as<float>()[0] = a;
        scale.data_as<float>()[0] = old_scale;
        backend->fp8_scale_from_amax(amax, fp8_max(format), margin, scale, scale_inv);
        const bool keep = a == 0.0f || !std::isfinite(a);
        const double fmax = format == DType::kE4M3 ? 448.0 : 57344.0;
        const float want = keep
                               ? old_scale
                               : static_cast<float>(fmax / std::max(static_cast<double>(a), 1e-12) /
                                                    std::pow(2.0, margin));
        EXPECT_EQ(scale.data_as<float>()[0], want);
        EXPECT_EQ(scale_inv.data_as<float>()[0], static_cast<float>(1.0 / want));
        // The registry's rule is the same one.
        EXPECT_EQ(fp8_scale_from_amax(a, old_scale, fp8_max(format), margin), want);
      }
    }
  }
  EXPECT_THROW(backend->fp8_scale_from_amax(amax, 448.0f, -1, scale, scale_inv), Error);
  EXPECT_THROW(backend->fp8_scale_from_amax(amax, 448.0f, 0, scale, scale), Error);
}

// Backend::fp8_reduce_scales (FP8 gradient reduction's pre-scale, on the device) against FP64
// arithmetic: q = min(fmax / (N amax), 2^(126 - ceil(log2 N))) rounded once (1/N for a zero or
// non-finite amax), w = 1 / (N q) from the rounded q.
TEST(Fp8Scaling, BackendReduceScalesAreTheFp64Rule) {
  std::unique_ptr<Backend> backend = make_cpu_backend();
  Tensor amax = Tensor::empty(Shape{1}, DType::kF32);
  Tensor q = Tensor::empty(Shape{1}, DType::kF32);
  Tensor w = Tensor::empty(Shape{1}, DType::kF32);
  const float amaxes[] = {3.5f, 1e-3f, 1e-30f, 1e-38f, 1e-45f, 3e38f, 0.0f, kInf, kNaN};
  for (const DType format : {DType::kE4M3, DType::kE5M2}) {
    for (const int n : {1, 2, 3, 4, 7, 1024}) {
      for (const float a : amaxes) {
        SCOPED_TRACE(std::string(dtype_name(format)) + " N " + std::to_string(n) + " amax " +
                     std::to_string(a));
        amax.data_as<float>()[0] = a;
        backend->fp8_reduce_scales(amax, fp8_max(format), n, q, w);
        const double fmax = format == DType::kE4M3 ? 448.0 : 57344.0;
        const double cap = std::pow(2.0, 126 - std::ceil(std::log2(n)));
        const float want_q =
            a > 0.0f && std::isfinite(a)
                ? static_cast<float>(std::min(fmax / (n * static_cast<double>(a)), cap))
                : static_cast<float>(1.0 / n);
        EXPECT_EQ(q.data_as<float>()[0], want_q);
        EXPECT_EQ(w.data_as<float>()[0], static_cast<float>(1.0 / (n * double{want_q})));
        EXPECT_TRUE(std::isfinite(q.data_as<float>()[0]) && std::isfinite(w.data_as<float>()[0]));
      }
    }
  }
  EXPECT_THROW(backend->fp8_reduce_scales(amax, 448.0f, 0, q, w), Error);
  EXPECT_THROW(backend->fp8_reduce_scales(amax, 448.0f, 2, q, q), Error);
}

}  // namespace
}  // namespace mantissa::core
