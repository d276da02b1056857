// Flash attention on the CUDA backend (cuda_flash_attention.cu) against the CPU backend's
// flash attention, which tests/core/test_flash_attention.cpp holds to FP64, and against the
// GPU's own materialised attention:
//  - out, lse and dqkv in BF16 and F16, head sizes 64 and 128 (each where the device has the
//    shared memory its backward needs), T a whole number of tiles, not one, a single
//    position, and GPT-2 124M's heads at T = 1024;
//  - twice the same input gives the same bits (no atomics anywhere);
//  - what the kernels refuse (F32, other head sizes) is said by unsupported_flash_attention
//    and raised by the ops.
// Tolerances: both backends round each probability and dS to the dtype before its product,
// but the GPU rounds the unnormalised exp(z - running max) and the CPU the normalised P, so
// the two differ by a few units of the dtype, not bit for bit.
//
// Built in every build; without a CUDA device every test reports "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>

#include "core/error.h"
#include "core/ops/backend.h"
#include "core/ops/flash_attention_switch.h"
#include "tests/common/test_util.h"
#include "tests/gpu/gpu_compare.h"

namespace mantissa::core {
namespace {

using namespace gpu_test;

struct FlashCase {
  int64_t B, T, C, H;
};

std::string describe(const FlashCase& c, DType dtype) {
  return std::string(dtype_name(dtype)) + " B " + std::to_string(c.B) + " T " +
         std::to_string(c.T) + " C " + std::to_string(c.C) + " H " + std::to_string(c.H);
}

struct Outputs {
  Tensor out, lse, dqkv;
};

// Forward and backward on `be` (operands already on its device), results brought to the host.
Outputs run_flash(Backends& b, Backend& be, const Tensor& qkv, const Tensor& dout,
                  const FlashCase& c) {
  const bool gpu = &be == b.gpu.get();
  const Device device = gpu ? b.device : Device::cpu();
  Tensor out = Tensor::empty(Shape{c.B, c.T, c.C}, qkv.dtype(), device);
  Tensor lse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::kF32, device);
  Tensor dqkv = Tensor::empty(qkv.shape(), qkv.dtype(), device);
  be.fill(out, NAN);
  be.fill(lse, NAN);
  be.fill(dqkv, NAN);
  be.flash_attention_forward(qkv, out, lse, static_cast<int>(c.H));
  be.flash_attention_backward(dout, qkv, out, lse, dqkv, static_cast<int>(c.H));
  if (!gpu) return {out, lse, dqkv};
  return {b.to_host(out), b.to_host(lse), b.to_host(dqkv)};
}

double out_tolerance(DType dtype) {
  return dtype == DType::kBF16 ? 2e-2 : 4e-3;
}

TEST(GpuFlashAttention, MatchesTheCpuBackend) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(31);
  int compared = 0;
  std::string not_run;
  // D = 64 and 128; T past two tiles, exactly one, a single position; GPT-2 124M's heads.
  for (const FlashCase& c :
       {FlashCase{2, 130, 128, 2}, FlashCase{1, 200, 256, 2}, FlashCase{1, 64, 64, 1},
        FlashCase{2, 1, 128, 1}, FlashCase{1, 1024, 768, 12}}) {
    for (DType dtype : {DType::kBF16, DType::kF16}) {
      const std::string what = describe(c, dtype);
      const Tensor qkv = random_tensor(Shape{c.B, c.T, 3 * c.C}, dtype, rng);
      const Tensor dout = random_tensor(Shape{c.B, c.T, c.C}, dtype, rng);
      // The backward's shared memory: D = 64 needs an A100's or Hopper's, D = 128 Hopper's.
      // A device without it says so here (the models then keep the materialised attention).
      const std::string unsupported = b.gpu->unsupported_flash_attention(dtype, c.C / c.H);
      if (!unsupported.empty()) {
        std::printf("%s: not run: %s\n", what.c_str(), unsupported.c_str());
        not_run = unsupported;
        continue;
      }
      const Outputs cpu = run_flash(b, *b.cpu, qkv, dout, c);
      const Outputs gpu = run_flash(b, *b.gpu, b.to_device(qkv), b.to_device(dout), c);
      expect_close(cpu.out, gpu.out, out_tolerance(dtype), what + " out");
      expect_close(cpu.lse, gpu.lse, 1e-5, what + " lse");
      expect_close(cpu.dqkv, gpu.dqkv, 2 * out_tolerance(dtype), what + " dqkv");
      ++compared;
    }
  }
  // An A100 and Hopper run heads of 64; a GPU with less shared memory per block none.
  if (compared == 0 && lacks_flash_shared_memory(not_run)) GTEST_SKIP() << not_run;
  EXPECT_GT(compared, 0) << "no case ran on this device: " << not_run;
}

// The GPU's materialised attention (cuBLASLt products, [B, H, T, T] probabilities) is an
// independent computation of the same function on the same device.
TEST(GpuFlashAttention, MatchesTheMaterialisedOpOnTheGpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(32);
  const FlashCase c{2, 300, 256, 4};  // D = 64
  const DType dtype = DType::kBF16;
  const std::string unsupported = b.gpu->unsupported_flash_attention(dtype, 64);
  if (!unsupported.empty()) GTEST_SKIP() << "skipped: " << unsupported;
  const Tensor qkv = b.to_device(random_tensor(Shape{c.B, c.T, 3 * c.C}, dtype, rng));
  const Tensor dout = b.to_device(random_tensor(Shape{c.B, c.T, c.C}, dtype, rng));
  const Outputs flash = run_flash(b, *b.gpu, qkv, dout, c);
  Tensor out = Tensor::empty(Shape{c.B, c.T, c.C}, dtype, b.device);
  Tensor att = Tensor::empty(Shape{c.B, c.H, c.T, c.T}, dtype, b.device);
  Tensor dqkv = Tensor::empty(qkv.shape(), dtype, b.device);
  b.gpu->attention_forward(qkv, out, att, static_cast<int>(c.H));
  b.gpu->attention_backward(dout, qkv, att, dqkv, static_cast<int>(c.H));
  expect_close(b.to_host(out), flash.out, 3e-2, "out");
  expect_close(b.to_host(dqkv), flash.dqkv, 6e-2, "dqkv");
}

TEST(GpuFlashAttention, RepeatsBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(33);
  // D = 128 where the device has its kernels, else 64.
  const FlashCase c128{2, 257, 512, 4}, c64{2, 257, 256, 4};
  const bool wide = b.gpu->unsupported_flash_attention(DType::kBF16, 128).empty();
  const FlashCase& c = wide ? c128 : c64;
  const std::string unsupported = b.gpu->unsupported_flash_attention(DType::kBF16, c.C / c.H);
  if (!unsupported.empty()) GTEST_SKIP() << "skipped: " << unsupported;
  const Tensor qkv = b.to_device(random_tensor(Shape{c.B, c.T, 3 * c.C}, DType::kBF16, rng));
  const Tensor dout = b.to_device(random_tensor(Shape{c.B, c.T, c.C}, DType::kBF16, rng));
  const Outputs first = run_flash(b, *b.gpu, qkv, dout, c);
  const Outputs second = run_flash(b, *b.gpu, qkv, dout, c);
  expect_same_bits(first.out, second.out, "out");
  expect_same_bits(first.lse, second.lse, "lse");
  expect_same_bits(first.dqkv, second.dqkv, "dqkv");
}

TEST(GpuFlashAttention, RefusesWhatTheKernelsDoNotTake) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  EXPECT_NE(b.gpu->unsupported_flash_attention(DType::kF32, 64).find("f32"), std::string::npos);
  EXPECT_NE(b.gpu->unsupported_flash_attention(DType::kBF16, 96).find("96"), std::string::npos);
  const FlashCase c{1, 8, 96, 1};
  Tensor qkv = Tensor::empty(Shape{c.B, c.T, 3 * c.C}, DType::kBF16, b.device);
  Tensor out = Tensor::empty(Shape{c.B, c.T, c.C}, DType::kBF16, b.device);
  Tensor lse = Tensor::empty(Shape{c.B, c.H, c.T}, DType::kF32, b.device);
  try {
    b.gpu->flash_attention_forward(qkv, out, lse, static_cast<int>(c.H));
    ADD_FAILURE() << "head size 96 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("flash_attention_forward: "), std::string::npos)
        << e.what();
  }
}

// MANTISSA_FLASH_ATTENTION=1 where the kernels do not take the operands is the user's setting
// to change: a config error (exit 2) saying why, without a source location.
TEST(GpuFlashAttention, ForcedWhereUnsupportedIsAConfigError) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  const ScopedEnv on("MANTISSA_FLASH_ATTENTION", "1");
  try {
    use_flash_attention(*b.gpu, DType::kF32, 64);
    ADD_FAILURE() << "F32 operands were accepted";
  } catch (const ConfigError& e) {
    EXPECT_EQ(std::string(e.what()),
              "MANTISSA_FLASH_ATTENTION=1: " + b.gpu->unsupported_flash_attention(DType::kF32, 64));
  }
}

}  // namespace
}  // namespace mantissa::core
