// Flash attention (Backend::flash_attention_forward and _backward) on the CPU backend, the
// reference the CUDA kernels are held to (tests/gpu/test_gpu_flash_attention.cpp):
//  - out, lse and dqkv against the FP64 references of tests/core/attention_reference.h, odd
//    T and D, several batches and heads, F32, BF16 and F16;
//  - the backward against finite differences of the FP64 forward;
//  - against the materialised attention op (the same function up to rounding);
//  - independent of the thread count, argument errors naming the op and operand;
//  - MANTISSA_FLASH_ATTENTION (core/ops/flash_attention_switch.h): which runs where, and a
//    bad value named.
// Outputs are poisoned with NaN first, so an element an op forgets to write cannot pass.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/flash_attention_switch.h"
#include "tests/common/test_util.h"
#include "tests/core/attention_reference.h"
#include "tests/core/fp64_reference.h"

namespace mantissa::core {
namespace {

Shape lse_shape(const AttnShape& s) {
  return Shape{s.B, s.H, s.T};
}

struct FlashResults {
  Tensor out, lse, dqkv;
};

FlashResults run_flash(Backend& be, const Tensor& qkv, const Tensor& dout, const AttnShape& s) {
  FlashResults r{poisoned(s.out(), qkv.dtype()), poisoned(lse_shape(s), DType::kF32),
                 poisoned(s.qkv(), qkv.dtype())};
  be.flash_attention_forward(qkv, r.out, r.lse, static_cast<int>(s.H));
  be.flash_attention_backward(dout, qkv, r.out, r.lse, r.dqkv, static_cast<int>(s.H));
  return r;
}

TEST(FlashAttention, MatchesFp64) {
  CpuBackend be;
  std::mt19937_64 rng(21);
  for (const AttnShape& s : kAttentionShapes) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string what = describe(s, dtype);
      const Tensor qkv = make(s.qkv(), dtype, uniform(rng, s.qkv().numel(), -2.0, 2.0));
      const Tensor dout = make(s.out(), dtype, uniform(rng, s.out().numel()));
      const FlashResults got = run_flash(be, qkv, dout, s);
      // F32: FP32 rounding only. BF16 and F16: each probability and dS is rounded to the
      // dtype before its product (2^-9 and 2^-12 relative), and out and dqkv once more.
      const double rtol = dtype == DType::kF32 ? 1e-5 : dtype == DType::kBF16 ? 1.5e-2 : 2e-3;
      expect_close(values_of(got.out), attention_ref(values_of(qkv), s).out, rtol, what + " out");
      expect_close(values_of(got.lse), attention_lse_ref(values_of(qkv), s), 1e-5, what + " lse");
      expect_close(values_of(got.dqkv), attention_backward_ref(values_of(dout), values_of(qkv), s),
                   2 * rtol, what + " dqkv");
    }
  }
}

TEST(FlashAttention, BackwardMatchesFiniteDifferences) {
  CpuBackend be;
  std::mt19937_64 rng(22);
  for (const AttnShape& s : {AttnShape{2, 5, 8, 2}, AttnShape{1, 7, 9, 3}}) {
    const Tensor qkv = make(s.qkv(), DType::kF32, uniform(rng, s.qkv().numel(), -2.0, 2.0));
    const Vec w = uniform(rng, s.out().numel());
    const Vec fd = finite_difference([&](const Vec& v) { return dot(attention_ref(v, s).out, w); },
                                     values_of(qkv));
    const FlashResults got = run_flash(be, qkv, make(s.out(), DType::kF32, w), s);
    expect_close(values_of(got.dqkv), fd, 1e-5, describe(s, DType::kF32) + " dqkv");
  }
}

// The materialised op rounds the scores and keeps P in the dtype; flash rounds P and dS
// before their products. Same function, different rounding: a few units of the dtype.
TEST(FlashAttention, MatchesTheMaterialisedOp) {
  CpuBackend be;
  std::mt19937_64 rng(23);
  const AttnShape s{2, 130, 128, 2};  // D = 64, the CUDA kernels' head size; T past two tiles
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string what = describe(s, dtype);
    const Tensor qkv = make(s.qkv(), dtype, uniform(rng, s.qkv().numel(), -2.0, 2.0));
    const Tensor dout = make(s.out(), dtype, uniform(rng, s.out().numel()));
    const FlashResults flash = run_flash(be, qkv, dout, s);
    Tensor out = poisoned(s.out(), dtype), att = poisoned(s.att(), dtype);
    Tensor dqkv = poisoned(s.qkv(), dtype);
    be.attention_forward(qkv, out, att, static_cast<int>(s.H));
    be.attention_backward(dout, qkv, att, dqkv, static_cast<int>(s.H));
    const double rtol = dtype == DType::kF32 ? 1e-5 : 3e-2;
    expect_close(values_of(flash.out), values_of(out), rtol, what + " out");
    expect_close(values_of(flash.dqkv), values_of(dqkv), 2 * rtol, what + " dqkv");
  }
}

TEST(FlashAttention, ResultsDoNotDependOnTheThreadCount) {
  CpuBackend be;
  std::mt19937_64 rng(24);
  const AttnShape s{2, 33, 64, 4};
  const Tensor qkv = make(s.qkv(), DType::kBF16, uniform(rng, s.qkv().numel()));
  const Tensor dout = make(s.out(), DType::kBF16, uniform(rng, s.out().numel()));
  FlashResults one, three;
  with_threads(1, [&] { one = run_flash(be, qkv, dout, s); });
  with_threads(3, [&] { three = run_flash(be, qkv, dout, s); });
  EXPECT_TRUE(same_bytes(one.out, three.out));
  EXPECT_TRUE(same_bytes(one.lse, three.lse));
  EXPECT_TRUE(same_bytes(one.dqkv, three.dqkv));
}

TEST(FlashAttention, BadArgumentsThrowNamingTheOpAndOperand) {
  CpuBackend be;
  const AttnShape s{1, 4, 8, 2};
  const Tensor qkv = poisoned(s.qkv(), DType::kBF16);
  Tensor out = poisoned(s.out(), DType::kBF16), lse = poisoned(lse_shape(s), DType::kF32);
  Tensor out_f32 = poisoned(s.out(), DType::kF32);
  Tensor lse_bf16 = poisoned(lse_shape(s), DType::kBF16);
  Tensor lse_short = poisoned(Shape{1, 2, 3}, DType::kF32);
  Tensor dqkv = poisoned(s.qkv(), DType::kBF16);
  expect_error([&] { be.flash_attention_forward(qkv, out_f32, lse, 2); },
               {"flash_attention_forward: operand out"});
  expect_error([&] { be.flash_attention_forward(qkv, out, lse_bf16, 2); },
               {"flash_attention_forward: operand lse"});
  expect_error([&] { be.flash_attention_forward(qkv, out, lse_short, 2); },
               {"flash_attention_forward: operand lse"});
  expect_error([&] { be.flash_attention_forward(qkv, out, lse, 3); }, {"n_head = 3"});
  expect_error([&] { be.flash_attention_backward(out_f32, qkv, out, lse, dqkv, 2); },
               {"flash_attention_backward: operand dout"});
  expect_error([&] { be.flash_attention_backward(out, qkv, out, lse, out, 2); },
               {"flash_attention_backward: operands dqkv"});
}

constexpr const char* kFlashSwitch = "MANTISSA_FLASH_ATTENTION";

TEST(FlashAttentionSwitch, ChoosesPerSettingAndNamesABadValue) {
  CpuBackend be;
  {
    ScopedEnv unset(kFlashSwitch, nullptr);
    EXPECT_FALSE(use_flash_attention(be, DType::kBF16, 64)) << "unset: the CPU runs materialised";
    check_flash_attention_switch();
  }
  {
    ScopedEnv on(kFlashSwitch, "1");
    EXPECT_TRUE(use_flash_attention(be, DType::kBF16, 64));
    EXPECT_TRUE(use_flash_attention(be, DType::kF32, 7)) << "the CPU has flash for any shape";
  }
  {
    ScopedEnv off(kFlashSwitch, "0");
    EXPECT_FALSE(use_flash_attention(be, DType::kBF16, 64));
  }
  {
    ScopedEnv bad(kFlashSwitch, "yes");
    expect_error([] { check_flash_attention_switch(); }, {"MANTISSA_FLASH_ATTENTION=yes: must be"});
    expect_error([&] { use_flash_attention(be, DType::kBF16, 64); },
                 {"MANTISSA_FLASH_ATTENTION=yes"});
  }
}

}  // namespace
}  // namespace mantissa::core
