// The CUDA backend against the CPU backend, op by op, through the Backend interface alone
// (attention and its primitives: test_gpu_attention.cpp).
//
// Every test builds random host inputs (normal values at several magnitudes, plus raw bit
// patterns and non-finite values where the op must handle them), runs the op on both
// backends from identical inputs (copied to the device with Backend::copy), and compares:
//  - bit for bit where both backends do the same arithmetic in the same order: casts (every
//    dtype pair, scales, saturation, stochastic rounding), amax (also accumulated), add_bias,
//    bias_backward, add, GELU (core/ops/math/gelu.h, compiled for both), embeddings (forward
//    and backward), unscale_check_finite (a NaN in an F32 result only as a NaN: the payloads
//    differ between x86 and NVIDIA hardware);
//  - within a relative tolerance elsewhere (reduction order, FMA contraction):
//    |gpu - cpu| <= tol * max(|cpu|, rms(cpu)) with tol 1e-5 for F32 results, 2e-3 for F16
//    and 1e-2 for BF16 (about two units in the last place), NaN only where the CPU has NaN;
//  - the softmax cross-entropy against an FP64 reference (cross_entropy_fp64).
// Outputs are poisoned with NaN first on both backends, so an element an op forgets to
// write cannot pass, and parameter gradients start from random values to check that they
// accumulate. Shapes include odd sizes and misaligned views, which take the kernels' scalar
// paths, and sizes large enough for their vectorised grid-stride loops.
//
// Built in every build; without a CUDA device every test reports "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops/backend.h"
#include "core/precision/block_scaling.h"
#include "tests/common/test_util.h"
#include "tests/gpu/gpu_compare.h"

namespace mantissa::core {
namespace {

using namespace gpu_test;

std::string describe_case(std::initializer_list<std::string> parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : " ") + p;
  return out;
}

// ---------------------------------------------------------------------------------------
// cast and amax

// Normal values over many magnitudes (so FP8 destinations see subnormals and overflow),
// a quarter raw bit patterns of the source dtype (NaNs, infs, extremes of every kind), fixed
// specials at the front, and after them every code of an 8- or 16-bit source where n has room.
Tensor cast_source(int64_t n, DType dtype, std::mt19937_64& rng) {
  Tensor t = random_tensor(Shape{n}, dtype, rng, {1e-6f, 1e-3f, 1.0f, 30.0f, 600.0f, 1e5f});
  std::uniform_int_distribution<uint32_t> bits;
  const uint32_t mask = dtype_size(dtype) == 4 ? 0xFFFFFFFFu : (1u << (8 * dtype_size(dtype))) - 1;
  for (int64_t i = 0; i < n; ++i) {
    if (bits(rng) % 4 == 0) set_code(t, i, bits(rng) & mask);
  }
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 464.0f, 57344.0f};
  for (int64_t i = 0; i < std::min<int64_t>(n, 8); ++i) set_code(t, i, encode(dtype, specials[i]));
  if (dtype_size(dtype) <= 2 && n >= 8 + int64_t{mask} + 1) {
    for (uint32_t code = 0; code <= mask; ++code) set_code(t, 8 + code, code);
  }
  return t;
}

TEST(GpuOps, CastMatchesCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(1);
  // 1 and 37: scalar loops only; 70001: the vectorised loop and a tail, and every 16-bit code.
  for (int64_t n : {1, 37, 70001}) {
    for (DType src_type : kFloatTypes) {
      const Tensor src = cast_source(n, src_type, rng);
      const Tensor src_dev = b.to_device(src);
      for (DType dst_type : kFloatTypes) {
        for (Rounding rounding : {Rounding::kNearest, Rounding::kStochastic}) {
          for (Saturation sat : {Saturation::kSatFinite, Saturation::kNoSat}) {
            for (float scale : {0.0f /* none */, 0.37f, 1000.0f}) {
              const std::string what =
                  describe_case({"cast", dtype_name(src_type), "->", dtype_name(dst_type),
                                 "n=" + std::to_string(n),
                                 rounding == Rounding::kNearest ? "nearest" : "stochastic",
                                 sat == Saturation::kSatFinite ? "satfinite" : "nosat",
                                 "scale=" + std::to_string(scale)});
              auto [dst, dst_dev] = b.poisoned(Shape{n}, dst_type);
              auto [amax, amax_dev] = b.poisoned(Shape{1}, DType::kF32);
              const Tensor scale_host = f32_scalar(scale);
              const Tensor scale_dev = b.to_device(scale_host);
              CastParams cpu_params{scale != 0.0f ? &scale_host : nullptr,
                                    scale != 0.0f ? &amax : nullptr, sat, rounding, 42};
              CastParams gpu_params{scale != 0.0f ? &scale_dev : nullptr,
                                    scale != 0.0f ? &amax_dev : nullptr, sat, rounding, 42};
              b.cpu->cast(src, dst, cpu_params);
              b.gpu->cast(src_dev, dst_dev, gpu_params);
              expect_same_bits(dst, b.to_host(dst_dev), what);
              if (scale != 0.0f) expect_same_values(amax, b.to_host(amax_dev), what + " amax");
            }
          }
        }
      }
    }
  }
}

// A view that starts one element into its buffer is not 16-byte aligned: the kernels must
// notice and take their scalar loops.
// accumulate_amax (a step's micro-batches): the device's atomicMax on the held amax's bits
// gives the CPU's larger_amax, NaN included; quantize_blocks the same.
TEST(GpuOps, AccumulatedAmaxMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  for (float held : {0.0f, 3.0f, INFINITY, NAN}) {
    for (float peak : {2.0f, 5.0f, INFINITY, NAN}) {
      const std::string what = "held " + std::to_string(held) + ", peak " + std::to_string(peak);
      Tensor src = Tensor::empty(Shape{4, 128}, DType::kF32);
      b.cpu->fill(src, 0.25f);
      src.data_as<float>()[130] = peak;
      const Tensor src_dev = b.to_device(src);
      Tensor amax = f32_scalar(held);
      Tensor amax_dev = b.to_device(amax);
      auto [dst, dst_dev] = b.poisoned(Shape{4, 128}, DType::kE4M3);
      CastParams cpu_cast;
      cpu_cast.amax = &amax;
      cpu_cast.accumulate_amax = true;
      CastParams gpu_cast = cpu_cast;
      gpu_cast.amax = &amax_dev;
      b.cpu->cast(src, dst, cpu_cast);
      b.gpu->cast(src_dev, dst_dev, gpu_cast);
      expect_same_values(amax, b.to_host(amax_dev), what + " cast");

      Tensor block_amax = f32_scalar(held);
      Tensor block_amax_dev = b.to_device(block_amax);
      auto [scales, scales_dev] =
          b.poisoned(Shape{scale_count(ScaleMode::kVec128, 4, 128)}, DType::kF32);
      BlockQuantizeParams cpu_blocks;
      cpu_blocks.amax = &block_amax;
      cpu_blocks.accumulate_amax = true;
      BlockQuantizeParams gpu_blocks = cpu_blocks;
      gpu_blocks.amax = &block_amax_dev;
      b.cpu->quantize_blocks(src, dst, scales, cpu_blocks);
      b.gpu->quantize_blocks(src_dev, dst_dev, scales_dev, gpu_blocks);
      expect_same_values(block_amax, b.to_host(block_amax_dev), what + " quantize_blocks");
    }
  }
}

TEST(GpuOps, CastOfMisalignedViewsMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(2);
  const int64_t n = 4101;
  for (DType src_type : {DType::kF32, DType::kBF16, DType::kE4M3}) {
    for (DType dst_type : {DType::kF32, DType::kBF16, DType::kE4M3}) {
      const Tensor src = cast_source(n + 1, src_type, rng);
      const Tensor src_dev = b.to_device(src);
      auto [dst, dst_dev] = b.poisoned(Shape{n + 1}, dst_type);
      auto [amax, amax_dev] = b.poisoned(Shape{1}, DType::kF32);
      Tensor src_view = src.view(1, Shape{n});
      Tensor dst_view = dst.view(1, Shape{n});
      Tensor src_dev_view = src_dev.view(1, Shape{n});
      Tensor dst_dev_view = dst_dev.view(1, Shape{n});
      CastParams cpu_params{nullptr, &amax, Saturation::kSatFinite, Rounding::kStochastic, 7};
      CastParams gpu_params{nullptr, &amax_dev, Saturation::kSatFinite, Rounding::kStochastic, 7};
      b.cpu->cast(src_view, dst_view, cpu_params);
      b.gpu->cast(src_dev_view, dst_dev_view, gpu_params);
      const std::string what =
          describe_case({"misaligned cast", dtype_name(src_type), "->", dtype_name(dst_type)});
      expect_same_bits(dst, b.to_host(dst_dev), what);
      expect_same_values(amax, b.to_host(amax_dev), what + " amax");
    }
  }
}

TEST(GpuOps, AmaxMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(3);
  for (int64_t n : {1, 100, 300001}) {
    for (DType dtype : kFloatTypes) {
      // The special value, or the largest magnitude, also in the last element: in the tail
      // that a vectorised loop handles apart when n is no multiple of its width.
      for (const char* special : {"none", "inf", "nan", "max at the end", "nan at the end"}) {
        Tensor x = random_tensor(Shape{n}, dtype, rng, {0.01f, 1.0f, 100.0f});
        const std::string kind = special;
        if (kind == "inf" || kind == "nan") {
          set_code(x, n / 2, encode(dtype, kind == "inf" ? -INFINITY : NAN));
        } else if (kind == "max at the end") {
          set_code(x, n - 1, encode(dtype, -1000.0f));
        } else if (kind == "nan at the end") {
          set_code(x, n - 1, encode(dtype, NAN));
        }
        auto [out, out_dev] = b.poisoned(Shape{1}, DType::kF32);
        b.cpu->amax(x, out);
        b.gpu->amax(b.to_device(x), out_dev);
        expect_same_values(
            out, b.to_host(out_dev),
            describe_case({"amax", dtype_name(dtype), "n=" + std::to_string(n), special}));
      }
    }
  }
}

// CURRENT scaling's scale from an amax, on the device: the CPU's values bit for bit, the old
// scale kept for a zero or non-finite amax.
TEST(GpuOps, Fp8ScaleFromAmaxMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  for (const float a : {3.5f, 1e-30f, 2.5e30f, 0.0f, INFINITY, NAN}) {
    for (const int margin : {0, 2}) {
      Tensor amax = Tensor::empty(Shape{1}, DType::kF32);
      amax.data_as<float>()[0] = a;
      Tensor scale = Tensor::empty(Shape{1}, DType::kF32);
      scale.data_as<float>()[0] = 0.625f;
      Tensor scale_inv = Tensor::empty(Shape{1}, DType::kF32);
      Tensor scale_dev = b.to_device(scale), scale_inv_dev = b.to_device(scale_inv);
      b.cpu->fp8_scale_from_amax(amax, 448.0f, margin, scale, scale_inv);
      b.gpu->fp8_scale_from_amax(b.to_device(amax), 448.0f, margin, scale_dev, scale_inv_dev);
      const std::string what =
          "fp8_scale_from_amax amax=" + std::to_string(a) + " margin=" + std::to_string(margin);
      expect_same_values(scale, b.to_host(scale_dev), what + " scale");
      expect_same_values(scale_inv, b.to_host(scale_inv_dev), what + " scale_inv");
    }
  }
}

// FP8 gradient reduction's pre-scales on the device: the CPU's bit for bit, finite at the cap.
TEST(GpuOps, Fp8ReduceScalesMatchCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  for (const float a : {3.5f, 1e-38f, 1e-45f, 0.0f, INFINITY, NAN}) {
    for (const int n : {1, 3, 8}) {
      Tensor amax = Tensor::empty(Shape{1}, DType::kF32);
      amax.data_as<float>()[0] = a;
      Tensor q = Tensor::empty(Shape{1}, DType::kF32), w = Tensor::empty(Shape{1}, DType::kF32);
      Tensor q_dev = b.to_device(q), w_dev = b.to_device(w);
      b.cpu->fp8_reduce_scales(amax, 57344.0f, n, q, w);
      b.gpu->fp8_reduce_scales(b.to_device(amax), 57344.0f, n, q_dev, w_dev);
      const std::string what =
          "fp8_reduce_scales amax=" + std::to_string(a) + " N=" + std::to_string(n);
      expect_same_values(q, b.to_host(q_dev), what + " q");
      expect_same_values(w, b.to_host(w_dev), what + " w");
    }
  }
}

// ---------------------------------------------------------------------------------------
// bias, residual add, GELU

TEST(GpuOps, AddBiasAndBiasBackwardMatchCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(4);
  // 600 rows span three of the column sums' 256-row blocks. The bias is the FP32 master or
  // a compute copy, in any activation dtype whatever the dtype of x.
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {600, 64}, {37, 768}}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (DType bias_type : {DType::kF32, DType::kBF16, DType::kF16}) {
        const std::string what = describe_case(
            {dtype_name(dtype), "bias", dtype_name(bias_type), Shape{rows, cols}.str()});
        Tensor x = random_tensor(Shape{rows, cols}, dtype, rng, {1.0f, 10.0f});
        const Tensor bias = random_tensor(Shape{cols}, bias_type, rng);
        Tensor x_dev = b.to_device(x);
        b.cpu->add_bias(x, bias);
        b.gpu->add_bias(x_dev, b.to_device(bias));
        expect_same_bits(x, b.to_host(x_dev), "add_bias " + what);

        Tensor dbias = random_tensor(Shape{cols}, DType::kF32, rng);
        Tensor dbias_dev = b.to_device(dbias);
        b.cpu->bias_backward(x, dbias);
        b.gpu->bias_backward(b.to_device(x), dbias_dev);
        expect_same_bits(dbias, b.to_host(dbias_dev), "bias_backward " + what);
      }
    }
  }
}

TEST(GpuOps, AddMatchesCpuBitForBitIncludingInPlace) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(5);
  for (int64_t n : {1, 13, 100003}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string what = describe_case({"add", dtype_name(dtype), "n=" + std::to_string(n)});
      const Tensor x = random_tensor(Shape{n}, dtype, rng, {0.1f, 1.0f, 1000.0f});
      const Tensor y = random_tensor(Shape{n}, dtype, rng, {0.1f, 1.0f, 1000.0f});
      auto [out, out_dev] = b.poisoned(Shape{n}, dtype);
      const Tensor x_dev = b.to_device(x);
      Tensor y_dev = b.to_device(y);
      b.cpu->add(x, y, out);
      b.gpu->add(x_dev, y_dev, out_dev);
      expect_same_bits(out, b.to_host(out_dev), what);
      // out aliasing b.
      Tensor y_cpu = b.clone_host(y);
      b.cpu->add(x, y_cpu, y_cpu);
      b.gpu->add(x_dev, y_dev, y_dev);
      expect_same_bits(y_cpu, b.to_host(y_dev), what + " in place");
    }
  }
}

// Both backends run core/ops/math/gelu.h, so forward and backward agree bit for bit: over
// random inputs at several magnitudes, the non-finite ones, and a dense sweep of [-30, 30]
// that crosses the tails (sigmoid(2u) through the FP32 subnormals, the derivative's clamp at
// |x| = 10).
TEST(GpuOps, GeluMatchesCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(6);
  for (int64_t n : {1, 29, 100001}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string what = describe_case({dtype_name(dtype), "n=" + std::to_string(n)});
      Tensor x = random_tensor(Shape{n}, dtype, rng, {0.1f, 1.0f, 4.0f, 30.0f});
      if (n > 4) {
        set_code(x, 0, encode(dtype, INFINITY));
        set_code(x, 1, encode(dtype, -INFINITY));
        set_code(x, 2, encode(dtype, NAN));
        set_code(x, 3, encode(dtype, -1e30f));
      }
      // The tail sweep in the first half of the large case.
      if (n > 50000) {
        for (int64_t i = 4; i < n / 2; ++i) {
          set_code(x, i, encode(dtype, static_cast<float>(-30.0 + 60.0 * i / (n / 2))));
        }
      }
      const Tensor dout = random_tensor(Shape{n}, dtype, rng);
      const Tensor x_dev = b.to_device(x);
      auto [out, out_dev] = b.poisoned(Shape{n}, dtype);
      b.cpu->gelu_forward(x, out);
      b.gpu->gelu_forward(x_dev, out_dev);
      expect_same_bits(out, b.to_host(out_dev), "gelu_forward " + what);

      auto [dx, dx_dev] = b.poisoned(Shape{n}, dtype);
      b.cpu->gelu_backward(x, dout, dx);
      b.gpu->gelu_backward(x_dev, b.to_device(dout), dx_dev);
      expect_same_bits(dx, b.to_host(dx_dev), "gelu_backward " + what);
      // dx aliasing dout.
      Tensor dout_cpu = b.clone_host(dout);
      Tensor dout_dev = b.to_device(dout);
      b.cpu->gelu_backward(x, dout_cpu, dout_cpu);
      b.gpu->gelu_backward(x_dev, dout_dev, dout_dev);
      expect_same_bits(dout_cpu, b.to_host(dout_dev), "gelu_backward in place " + what);
    }
  }
}

// ---------------------------------------------------------------------------------------
// LayerNorm

struct LayerNormCase {
  Shape shape;
  DType x, out, param;
};

TEST(GpuOps, LayerNormMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(7);
  const LayerNormCase cases[] = {
      {Shape{1, 8}, DType::kF32, DType::kF32, DType::kF32},
      {Shape{5, 7}, DType::kBF16, DType::kBF16, DType::kBF16},  // C % 8 != 0: scalar path
      {Shape{3, 4, 768}, DType::kBF16, DType::kBF16, DType::kF32},
      {Shape{300, 64}, DType::kF32, DType::kF32, DType::kBF16},  // two 256-row blocks
      {Shape{9, 40}, DType::kF16, DType::kF32, DType::kF32},
      {Shape{17, 96}, DType::kF32, DType::kBF16, DType::kF32},
      // FP16 training: F16 activations with the F16 compute copy (vectorised and scalar
      // paths), and parameter dtypes that differ from the activations'.
      {Shape{2, 33, 768}, DType::kF16, DType::kF16, DType::kF16},
      {Shape{7, 13}, DType::kF16, DType::kF16, DType::kF16},
      {Shape{300, 40}, DType::kF16, DType::kF16, DType::kBF16},
      {Shape{11, 64}, DType::kBF16, DType::kBF16, DType::kF16},
      {Shape{5, 24}, DType::kF32, DType::kF16, DType::kF16},
  };
  for (const LayerNormCase& c : cases) {
    const std::string what = describe_case({c.shape.str(), "x", dtype_name(c.x), "out",
                                            dtype_name(c.out), "params", dtype_name(c.param)});
    const int64_t C = c.shape[-1];
    const int64_t N = c.shape.numel() / C;
    // An offset mean makes the two-pass variance matter.
    Tensor x = random_tensor(c.shape, c.x, rng, {1.0f, 3.0f});
    for (int64_t i = 0; i < x.numel(); ++i)
      set_code(x, i, encode(c.x, static_cast<float>(value_at(x, i)) + 5.0f));
    const Tensor gamma = random_tensor(Shape{C}, c.param, rng);
    const Tensor beta = random_tensor(Shape{C}, c.param, rng);
    const Tensor x_dev = b.to_device(x);
    const Tensor gamma_dev = b.to_device(gamma);
    auto [out, out_dev] = b.poisoned(c.shape, c.out);
    auto [mean, mean_dev] = b.poisoned(Shape{N}, DType::kF32);
    auto [rstd, rstd_dev] = b.poisoned(Shape{N}, DType::kF32);
    b.cpu->layernorm_forward(x, gamma, beta, out, mean, rstd);
    b.gpu->layernorm_forward(x_dev, gamma_dev, b.to_device(beta), out_dev, mean_dev, rstd_dev);
    expect_close(out, b.to_host(out_dev), "layernorm_forward out " + what);
    expect_close(mean, b.to_host(mean_dev), "layernorm_forward mean " + what);
    expect_close(rstd, b.to_host(rstd_dev), "layernorm_forward rstd " + what);

    // The backward from the CPU's statistics on both backends.
    const Tensor dout = random_tensor(c.shape, c.x, rng);
    auto [dx, dx_dev] = b.poisoned(c.shape, c.x);
    Tensor dgamma = random_tensor(Shape{C}, DType::kF32, rng);
    Tensor dbeta = random_tensor(Shape{C}, DType::kF32, rng);
    Tensor dgamma_dev = b.to_device(dgamma);
    Tensor dbeta_dev = b.to_device(dbeta);
    b.cpu->layernorm_backward(dout, x, gamma, mean, rstd, dx, dgamma, dbeta);
    b.gpu->layernorm_backward(b.to_device(dout), x_dev, gamma_dev, b.to_device(mean),
                              b.to_device(rstd), dx_dev, dgamma_dev, dbeta_dev);
    expect_close(dx, b.to_host(dx_dev), "layernorm_backward dx " + what);
    expect_close(dgamma, b.to_host(dgamma_dev), "layernorm_backward dgamma " + what);
    expect_close(dbeta, b.to_host(dbeta_dev), "layernorm_backward dbeta " + what);
  }
}

// ---------------------------------------------------------------------------------------
// Embeddings

TEST(GpuOps, EmbeddingMatchesCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(9);
  struct Case {
    int64_t B, T, V, C;
    DType param, activation;
  };
  // Small vocabularies repeat tokens many times, which is what the backward must sum.
  const Case cases[] = {
      {1, 1, 1, 1, DType::kF32, DType::kF32},      {2, 9, 11, 13, DType::kBF16, DType::kBF16},
      {4, 64, 50, 768, DType::kF32, DType::kBF16}, {3, 100, 1000, 40, DType::kBF16, DType::kF16},
      {2, 50, 300, 64, DType::kF16, DType::kF16},  {3, 9, 20, 24, DType::kF16, DType::kF32}};
  for (const Case& c : cases) {
    const std::string what = describe_case({"B=" + std::to_string(c.B), "T=" + std::to_string(c.T),
                                            "V=" + std::to_string(c.V), "C=" + std::to_string(c.C),
                                            dtype_name(c.param), dtype_name(c.activation)});
    const Tensor tokens = tokens_tensor(Shape{c.B, c.T}, static_cast<int32_t>(c.V), rng);
    const Tensor wte = random_tensor(Shape{c.V, c.C}, c.param, rng);
    const Tensor wpe = random_tensor(Shape{c.T + 3, c.C}, c.param, rng);
    const Tensor tokens_dev = b.to_device(tokens);
    auto [out, out_dev] = b.poisoned(Shape{c.B, c.T, c.C}, c.activation);
    b.cpu->embedding_forward(tokens, wte, wpe, out);
    b.gpu->embedding_forward(tokens_dev, b.to_device(wte), b.to_device(wpe), out_dev);
    expect_same_bits(out, b.to_host(out_dev), "embedding_forward " + what);

    const Tensor dout = random_tensor(Shape{c.B, c.T, c.C}, c.activation, rng);
    Tensor dwte = random_tensor(Shape{c.V, c.C}, DType::kF32, rng);
    Tensor dwpe = random_tensor(Shape{c.T + 3, c.C}, DType::kF32, rng);
    Tensor dwte_dev = b.to_device(dwte);
    Tensor dwpe_dev = b.to_device(dwpe);
    b.cpu->embedding_backward(dout, tokens, dwte, dwpe);
    b.gpu->embedding_backward(b.to_device(dout), tokens_dev, dwte_dev, dwpe_dev);
    expect_same_bits(dwte, b.to_host(dwte_dev), "embedding_backward dwte " + what);
    expect_same_bits(dwpe, b.to_host(dwpe_dev), "embedding_backward dwpe " + what);
  }
}

// Indices outside the table (the CPU backend throws for them) cost the GPU no host
// synchronisation: their rows of the embedding and the loss are NaN, every other row is the
// CPU's result on the same valid indices, and their embedding gradient is dropped.
TEST(GpuOps, OutOfRangeIndicesBecomeNaNWithoutASync) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(15);
  const int64_t B = 2, T = 6, V = 50, C = 8;
  Tensor tokens = tokens_tensor(Shape{B, T}, static_cast<int32_t>(V), rng);
  Tensor bad = tokens_tensor(Shape{B, T}, static_cast<int32_t>(V), rng);
  std::memcpy(bad.data(), tokens.data(), tokens.nbytes());
  bad.data_as<int32_t>()[9] = static_cast<int32_t>(V);
  bad.data_as<int32_t>()[11] = -3;
  const Tensor wte = random_tensor(Shape{V, C}, DType::kF32, rng);
  const Tensor wpe = random_tensor(Shape{T, C}, DType::kF32, rng);
  const Tensor bad_dev = b.to_device(bad);
  const Tensor wte_dev = b.to_device(wte), wpe_dev = b.to_device(wpe);
  Tensor out_dev = b.to_device(random_tensor(Shape{B, T, C}, DType::kF32, rng));
  const Tensor logits = random_tensor(Shape{B * T, V}, DType::kF32, rng);
  const Tensor logits_dev = b.to_device(logits);
  Tensor losses_dev = b.to_device(random_tensor(Shape{B * T}, DType::kF32, rng));
  Tensor dlogits_dev = b.to_device(logits);

  const int64_t syncs = b.gpu->host_syncs();
  b.gpu->embedding_forward(bad_dev, wte_dev, wpe_dev, out_dev);
  b.gpu->softmax_cross_entropy(logits_dev, V, bad_dev.reshape(Shape{B * T}), losses_dev,
                               &dlogits_dev, 1.0f);
  EXPECT_EQ(b.gpu->host_syncs(), syncs) << "the ops must not wait for the device";

  Tensor out = random_tensor(Shape{B, T, C}, DType::kF32, rng);
  b.cpu->embedding_forward(tokens, wte, wpe, out);
  Tensor losses = random_tensor(Shape{B * T}, DType::kF32, rng);
  Tensor dlogits = logits;
  b.cpu->softmax_cross_entropy(logits, V, tokens.reshape(Shape{B * T}), losses, &dlogits, 1.0f);
  const Tensor out_gpu = b.to_host(out_dev), losses_gpu = b.to_host(losses_dev);
  const Tensor dlogits_gpu = b.to_host(dlogits_dev);
  for (int64_t row = 0; row < B * T; ++row) {
    const bool bad_row = row == 9 || row == 11;
    for (int64_t c = 0; c < C; ++c) {
      const float g = out_gpu.data_as<float>()[row * C + c];
      if (bad_row) {
        EXPECT_TRUE(std::isnan(g)) << "embedding row " << row;
      } else {
        EXPECT_EQ(g, out.data_as<float>()[row * C + c]) << "embedding row " << row;
      }
    }
    const float loss = losses_gpu.data_as<float>()[row];
    EXPECT_EQ(std::isnan(loss), bad_row) << "loss row " << row;
    if (!bad_row) {
      EXPECT_NEAR(loss, losses.data_as<float>()[row], 1e-5f) << "loss row " << row;
    }
    for (int64_t v = 0; v < V; ++v) {
      const float dz = dlogits_gpu.data_as<float>()[row * V + v];
      EXPECT_EQ(std::isnan(dz), bad_row) << "dlogits row " << row << " column " << v;
    }
  }

  // The gradient: the CPU's with the bad positions' gradients left out.
  Tensor dout = random_tensor(Shape{B, T, C}, DType::kF32, rng);
  const Tensor dout_dev = b.to_device(dout);
  Tensor dwte = random_tensor(Shape{V, C}, DType::kF32, rng);
  Tensor dwte_dev = b.to_device(dwte);
  Tensor dwpe = random_tensor(Shape{T, C}, DType::kF32, rng);
  Tensor dwpe_dev = b.to_device(dwpe);
  b.gpu->embedding_backward(dout_dev, bad_dev, dwte_dev, dwpe_dev);
  for (const int64_t row : {9, 11})
    std::memset(dout.data_as<float>() + row * C, 0, C * sizeof(float));
  b.cpu->embedding_backward(dout, tokens, dwte, dwpe);
  expect_same_bits(dwte, b.to_host(dwte_dev), "embedding_backward with bad tokens");
  expect_same_bits(dwpe, b.to_host(dwpe_dev), "embedding_backward's dwpe with bad tokens");

  // A target in the padding of a padded vocabulary (valid_cols <= target < V) is out of range
  // too: the CPU backend throws for it, the GPU makes that row's loss NaN.
  const Tensor padded_dev = b.to_device(random_tensor(Shape{B * T, V + 14}, DType::kF32, rng));
  Tensor padded_targets = b.clone_host(tokens.reshape(Shape{B * T}));
  padded_targets.data_as<int32_t>()[3] = static_cast<int32_t>(V + 2);
  Tensor padded_losses_dev = b.to_device(random_tensor(Shape{B * T}, DType::kF32, rng));
  b.gpu->softmax_cross_entropy(padded_dev, V, b.to_device(padded_targets), padded_losses_dev,
                               nullptr, 1.0f);
  const Tensor padded_losses = b.to_host(padded_losses_dev);
  for (int64_t row = 0; row < B * T; ++row) {
    EXPECT_EQ(std::isnan(padded_losses.data_as<float>()[row]), row == 3)
        << "loss row " << row << " with a target in the padding";
  }
}

// ---------------------------------------------------------------------------------------
// Cross-entropy

// softmax_cross_entropy in FP64 from the stored logits: the losses, and when `dlogits` is given
// the gradient rounded once to its dtype (+0 past valid_cols). The GPU is held to this: over
// 50257 columns every F32 probability inherits the error of the row's sum, and the reference
// is the one that has none. (A running FP32 sum, which the CPU backend used until it summed in
// FP64, was off by 5e-5 in dlogits on these rows; an emulation of the kernel, its thread
// order and an exp off by up to 2 ulp, stays within 3e-6.)
void cross_entropy_fp64(const Tensor& logits, int64_t valid_cols, const Tensor& targets,
                        float grad_scale, Tensor& losses, Tensor* dlogits) {
  const int64_t N = logits.dim(0), V = logits.dim(1);
  for (int64_t n = 0; n < N; ++n) {
    double max_z = -INFINITY;
    for (int64_t v = 0; v < valid_cols; ++v) max_z = std::max(max_z, value_at(logits, n * V + v));
    double sum = 0.0;
    for (int64_t v = 0; v < valid_cols; ++v) sum += std::exp(value_at(logits, n * V + v) - max_z);
    const double log_sum_exp = max_z + std::log(sum);
    const int32_t target = targets.data_as<const int32_t>()[n];
    losses.data_as<float>()[n] = static_cast<float>(log_sum_exp - value_at(logits, n * V + target));
    if (dlogits == nullptr) continue;
    for (int64_t v = 0; v < V; ++v) {
      const double p = v < valid_cols ? std::exp(value_at(logits, n * V + v) - log_sum_exp) : 0.0;
      const double dz = (v == target ? p - 1.0 : p) * grad_scale;
      set_code(*dlogits, n * V + v, encode(dlogits->dtype(), static_cast<float>(dz)));
    }
  }
}

TEST(GpuOps, SoftmaxCrossEntropyMatchesFp64Reference) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(10);
  struct Case {
    int64_t N, V;
    DType logits, dlogits;
  };
  const Case cases[] = {
      {1, 3, DType::kF32, DType::kF32},       {7, 1000, DType::kBF16, DType::kBF16},
      {5, 333, DType::kF16, DType::kF32},     {4, 50257, DType::kF32, DType::kF32},
      {3, 50257, DType::kBF16, DType::kBF16}, {6, 2048, DType::kF16, DType::kF16},
      {2, 50257, DType::kF16, DType::kBF16}};
  for (const Case& c : cases) {
    const std::string what = describe_case({"N=" + std::to_string(c.N), "V=" + std::to_string(c.V),
                                            dtype_name(c.logits), dtype_name(c.dlogits)});
    Tensor logits = random_tensor(Shape{c.N, c.V}, c.logits, rng, {1.0f, 5.0f});
    Tensor targets = tokens_tensor(Shape{c.N}, static_cast<int32_t>(c.V), rng);
    // Row 0's largest logit in the last column, in the tail a vectorised reduction handles
    // apart (50257 is no multiple of any vector width): dropped from the max or the sum, it
    // moves the loss by far more than the tolerance. The target lies elsewhere: a target
    // holding almost all the probability leaves a loss and gradient of about 1e-11, which an
    // FP32 sum rounds to exactly 0 where FP64 does not.
    set_code(logits, c.V - 1, encode(c.logits, 30.0f));
    targets.data_as<int32_t>()[0] = 0;
    const Tensor logits_dev = b.to_device(logits);
    const Tensor targets_dev = b.to_device(targets);
    const float grad_scale = 1024.0f / static_cast<float>(c.N);

    Tensor losses = Tensor::empty(Shape{c.N}, DType::kF32);
    Tensor dlogits = Tensor::empty(Shape{c.N, c.V}, c.dlogits);
    cross_entropy_fp64(logits, c.V, targets, grad_scale, losses, &dlogits);

    // Loss only.
    Tensor losses_dev = b.poisoned(Shape{c.N}, DType::kF32).second;
    b.gpu->softmax_cross_entropy(logits_dev, c.V, targets_dev, losses_dev, nullptr, grad_scale);
    expect_close(losses, b.to_host(losses_dev), "losses " + what);

    // Loss and a separate gradient.
    Tensor dlogits_dev = b.poisoned(Shape{c.N, c.V}, c.dlogits).second;
    b.gpu->fill(losses_dev, NAN);
    b.gpu->softmax_cross_entropy(logits_dev, c.V, targets_dev, losses_dev, &dlogits_dev,
                                 grad_scale);
    expect_close(losses, b.to_host(losses_dev), "losses with dlogits " + what);
    expect_close(dlogits, b.to_host(dlogits_dev), "dlogits " + what);

    // The gradient written over the logits, in their dtype.
    Tensor inplace = Tensor::empty(Shape{c.N, c.V}, c.logits);
    cross_entropy_fp64(logits, c.V, targets, grad_scale, losses, &inplace);
    Tensor inplace_dev = b.to_device(logits);
    b.gpu->softmax_cross_entropy(inplace_dev, c.V, targets_dev, losses_dev, &inplace_dev,
                                 grad_scale);
    expect_close(losses, b.to_host(losses_dev), "losses in place " + what);
    expect_close(inplace, b.to_host(inplace_dev), "dlogits in place " + what);
  }
}

// A padded vocabulary: logits [N, Vp] of which the first V columns are the softmax's, the
// padding holding junk (huge, infinite, NaN). The GPU matches the FP64 reference (within the
// tolerance above), reproduces bit for bit its own result on an unpadded copy of the first V
// columns (each thread takes the same columns, the reductions add the same partial sums), and
// writes exactly +0 into the padding's gradient, with a separate dlogits and in place.
TEST(GpuOps, SoftmaxCrossEntropyPaddedVocabularyMatchesFp64Reference) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(21);
  struct Case {
    int64_t N, V, Vp;
    DType dtype;
  };
  const Case cases[] = {
      {4, 50257, 50304, DType::kF32}, {3, 200, 256, DType::kBF16}, {5, 1000, 1024, DType::kF16}};
  const float junk[] = {1e30f, INFINITY, NAN, -INFINITY, 0.0f, 80.0f};
  for (const Case& c : cases) {
    const std::string what = describe_case({"N=" + std::to_string(c.N), "V=" + std::to_string(c.V),
                                            "Vp=" + std::to_string(c.Vp), dtype_name(c.dtype)});
    const Tensor real = random_tensor(Shape{c.N, c.V}, c.dtype, rng, {1.0f, 5.0f});
    Tensor logits = Tensor::empty(Shape{c.N, c.Vp}, c.dtype);
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t v = 0; v < c.Vp; ++v)
        set_code(logits, n * c.Vp + v,
                 v < c.V ? code_at(real, n * c.V + v)
                         : encode(c.dtype, junk[(n + v) % 6], Saturation::kNoSat));
    const Tensor targets = tokens_tensor(Shape{c.N}, static_cast<int32_t>(c.V), rng);
    const Tensor targets_dev = b.to_device(targets);
    const float grad_scale = 1024.0f / static_cast<float>(c.N);

    Tensor losses = Tensor::empty(Shape{c.N}, DType::kF32);
    Tensor dlogits = Tensor::empty(Shape{c.N, c.Vp}, c.dtype);
    cross_entropy_fp64(logits, c.V, targets, grad_scale, losses, &dlogits);
    Tensor losses_dev = b.poisoned(Shape{c.N}, DType::kF32).second;
    Tensor dlogits_dev = b.poisoned(Shape{c.N, c.Vp}, c.dtype).second;
    b.gpu->softmax_cross_entropy(b.to_device(logits), c.V, targets_dev, losses_dev, &dlogits_dev,
                                 grad_scale);
    expect_close(losses, b.to_host(losses_dev), "losses " + what);
    expect_close(dlogits, b.to_host(dlogits_dev), "dlogits " + what);

    // The GPU on the unpadded copy, then what the padded calls must give: its results, and +0
    // in the padding.
    Tensor unpadded_losses = b.poisoned(Shape{c.N}, DType::kF32).second;
    Tensor unpadded_dlogits = b.poisoned(Shape{c.N, c.V}, c.dtype).second;
    b.gpu->softmax_cross_entropy(b.to_device(real), c.V, targets_dev, unpadded_losses,
                                 &unpadded_dlogits, grad_scale);
    const Tensor reference = b.to_host(unpadded_dlogits);
    Tensor expected = Tensor::empty(Shape{c.N, c.Vp}, c.dtype);
    for (int64_t n = 0; n < c.N; ++n)
      for (int64_t v = 0; v < c.Vp; ++v)
        set_code(expected, n * c.Vp + v, v < c.V ? code_at(reference, n * c.V + v) : 0);
    expect_same_bits(b.to_host(unpadded_losses), b.to_host(losses_dev),
                     "losses against the unpadded GPU call " + what);
    expect_same_bits(expected, b.to_host(dlogits_dev),
                     "dlogits against the unpadded GPU call " + what);

    Tensor inplace_dev = b.to_device(logits);
    b.gpu->softmax_cross_entropy(inplace_dev, c.V, targets_dev, losses_dev, &inplace_dev,
                                 grad_scale);
    expect_same_bits(expected, b.to_host(inplace_dev),
                     "dlogits in place against the unpadded GPU call " + what);
  }
}

// ---------------------------------------------------------------------------------------
// Optimizer and gradient checks

TEST(GpuOps, AdamWMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(11);
  for (int64_t n : {1, 1000, 100003}) {
    for (bool misaligned : {false, true}) {
      for (DType grad_type : {DType::kF32, DType::kBF16}) {
        for (int copy_type = -1; copy_type < 3; ++copy_type) {  // none, F32, BF16, F16
          const DType copy_dtype = copy_type == 1   ? DType::kBF16
                                   : copy_type == 2 ? DType::kF16
                                                    : DType::kF32;
          const std::string what = describe_case(
              {"adamw n=" + std::to_string(n), misaligned ? "misaligned" : "aligned", "grads",
               dtype_name(grad_type), "copy", copy_type < 0 ? "none" : dtype_name(copy_dtype)});
          const int64_t offset = misaligned ? 1 : 0;
          const Shape full{n + offset};
          Tensor params = random_tensor(full, DType::kF32, rng);
          const Tensor params_before = b.clone_host(params);
          Tensor m = random_tensor(full, DType::kF32, rng, {0.01f});
          Tensor v = random_tensor(full, DType::kF32, rng, {1e-4f});
          for (int64_t i = 0; i < v.numel(); ++i)
            v.data_as<float>()[i] = std::fabs(v.data_as<float>()[i]);
          auto [copy, copy_dev] = b.poisoned(full, copy_dtype);
          Tensor params_dev = b.to_device(params);
          Tensor m_dev = b.to_device(m);
          Tensor v_dev = b.to_device(v);
          const Shape shape{n};
          Tensor p_view = params.view(offset, shape), p_dev_view = params_dev.view(offset, shape);
          Tensor m_view = m.view(offset, shape), m_dev_view = m_dev.view(offset, shape);
          Tensor v_view = v.view(offset, shape), v_dev_view = v_dev.view(offset, shape);
          Tensor c_view = copy.view(offset, shape), c_dev_view = copy_dev.view(offset, shape);
          // Two steps, so that the second starts from state the first one wrote.
          for (int64_t step : {1, 1000}) {
            const Tensor grads = random_tensor(shape, grad_type, rng, {0.01f, 1.0f});
            const Tensor grads_dev = b.to_device(grads);
            AdamWParams p;
            p.lr = 1e-3f;
            p.weight_decay = 0.1f;
            p.step = step;
            p.grad_scale = 0.5f;
            const std::vector<ParamRange> all = {{0, n, true}};
            b.cpu->adamw(p_view, grads, m_view, v_view, copy_type < 0 ? nullptr : &c_view, all, p);
            b.gpu->adamw(p_dev_view, grads_dev, m_dev_view, v_dev_view,
                         copy_type < 0 ? nullptr : &c_dev_view, all, p);
          }
          expect_close(params, b.to_host(params_dev), what + " params");
          // The update itself: a few 1e-3 on parameters of about 1, so that compared as the
          // parameters are (1e-5 of them), an update 0.5% off would pass. 1e-3 of it still
          // leaves a few rounding steps of the parameters.
          expect_close(difference(params, params_before),
                       difference(b.to_host(params_dev), params_before), 1e-3, what + " update");
          expect_close(m, b.to_host(m_dev), what + " m");
          expect_close(v, b.to_host(v_dev), what + " v");
          if (copy_type >= 0) expect_close(copy, b.to_host(copy_dev), what + " compute copy");
        }
      }
    }
  }
}

// A model's update in one call: more ranges than one launch takes (the CUDA backend launches
// once per 160), of random sizes from empty to several packs, at offsets that are and are not
// 16-byte aligned, with and without decay, with gaps between them that neither backend may
// touch (the copies start poisoned, so a gap written on either side fails the comparison).
TEST(GpuOps, AdamWOverRangesMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(12);
  std::vector<ParamRange> ranges;
  int64_t end = 0;
  for (int r = 0; r < 400; ++r) {
    const int64_t gap = static_cast<int64_t>(rng() % 3);
    const int64_t numel = r % 50 == 0 ? 20000 + static_cast<int64_t>(rng() % 9) : rng() % 300;
    ranges.push_back({end + gap, numel, rng() % 2 == 0});
    end += gap + numel;
  }
  const Shape shape{end + 5};
  // The compute copy: none (kI32 stands for it), or each dtype the op writes.
  for (DType grad_type : {DType::kF32, DType::kBF16}) {
    for (DType copy_type : {DType::kI32, DType::kF32, DType::kBF16, DType::kF16}) {
      const bool with_copy = copy_type != DType::kI32;
      const std::string what =
          describe_case({"adamw over 400 ranges", "grads", dtype_name(grad_type), "copy",
                         with_copy ? dtype_name(copy_type) : "none"});
      Tensor params = random_tensor(shape, DType::kF32, rng);
      Tensor m = random_tensor(shape, DType::kF32, rng, {0.01f});
      Tensor v = random_tensor(shape, DType::kF32, rng, {1e-4f});
      for (int64_t i = 0; i < v.numel(); ++i)
        v.data_as<float>()[i] = std::fabs(v.data_as<float>()[i]);
      auto [copy, copy_dev] = b.poisoned(shape, with_copy ? copy_type : DType::kF32);
      Tensor params_dev = b.to_device(params), m_dev = b.to_device(m), v_dev = b.to_device(v);
      const Tensor params_before = b.clone_host(params);
      for (int64_t step : {1, 2}) {
        const Tensor grads = random_tensor(shape, grad_type, rng, {0.01f, 1.0f});
        const Tensor grads_dev = b.to_device(grads);
        AdamWParams p;
        p.lr = 1e-3f;
        p.weight_decay = 0.5f;
        p.step = step;
        b.cpu->adamw(params, grads, m, v, with_copy ? &copy : nullptr, ranges, p);
        b.gpu->adamw(params_dev, grads_dev, m_dev, v_dev, with_copy ? &copy_dev : nullptr, ranges,
                     p);
      }
      expect_close(params, b.to_host(params_dev), what + " params");
      // The update itself, as AdamWMatchesCpu compares it (an update 0.5% off passes the
      // comparison of the parameters).
      expect_close(difference(params, params_before),
                   difference(b.to_host(params_dev), params_before), 1e-3, what + " update");
      expect_close(m, b.to_host(m_dev), what + " m");
      expect_close(v, b.to_host(v_dev), what + " v");
      if (with_copy) expect_close(copy, b.to_host(copy_dev), what + " compute copy");
    }
  }
}

// The consistency check compares checksums computed where the weights live: the GPU's must be
// the CPU's bit for bit, at lengths with and without a tail of bytes past the last whole word
// and at one larger than the grid (many words per thread).
TEST(GpuOps, ChecksumMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(13);
  for (int64_t n : {0, 1, 3, 4, 5, 1000, 5000001}) {
    const Tensor x = random_tensor(Shape{n}, DType::kBF16, rng);
    Tensor cpu_sum = i64_scalar(-1);
    Tensor gpu_sum = b.to_device(i64_scalar(-1));
    b.cpu->checksum(x, cpu_sum);
    b.gpu->checksum(b.to_device(x), gpu_sum);
    EXPECT_EQ(b.to_host(gpu_sum).data_as<int64_t>()[0], cpu_sum.data_as<int64_t>()[0])
        << "checksum of bf16[" << n << "]";
  }
}

// Both accumulate the squares in FP64 and round the sum to FP32 once. A non-finite result (an
// FP32 overflow) must be the same value on both; a finite one agrees to 1e-6.
void expect_same_sum(const Tensor& cpu, const Tensor& gpu, const std::string& what) {
  const float expected = cpu.data_as<float>()[0];
  const float actual = gpu.data_as<float>()[0];
  if (!std::isfinite(expected)) {
    EXPECT_TRUE(actual == expected || (std::isnan(expected) && std::isnan(actual)))
        << what << ": " << actual << " on the GPU, " << expected << " on the CPU";
  } else {
    EXPECT_NEAR(actual, expected, 1e-6 * std::fabs(expected)) << what;
  }
}

TEST(GpuOps, SumSquaresMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(12);
  for (int64_t n : {1, 1000, (1 << 20) + 3}) {
    for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::string what =
          describe_case({"sum_squares", dtype_name(dtype), "n=" + std::to_string(n)});
      const Tensor x = random_tensor(Shape{n}, dtype, rng, {0.01f, 1.0f, 100.0f});
      Tensor out = f32_scalar(2.5f);
      Tensor out_dev = b.to_device(out);
      const Tensor x_dev = b.to_device(x);
      // Twice: the result accumulates.
      for (int call = 0; call < 2; ++call) {
        b.cpu->sum_squares(x, out);
        b.gpu->sum_squares(x_dev, out_dev);
      }
      expect_same_sum(out, b.to_host(out_dev), what);
    }
  }

  // What the FP64 accumulation is for: squares below FP32's normal range (values around 3e-22,
  // squares around 1e-43, a few dozen units of the smallest subnormal) keep their digits.
  // Squared in FP32 they would lose about 1e-4 of the total (5e-4 if also summed in FP32); in
  // FP64 both backends agree with an FP64 sum to 1e-6.
  for (DType dtype : {DType::kF32, DType::kBF16}) {
    const std::string what = describe_case({"sum_squares of tiny values", dtype_name(dtype)});
    const Tensor x = random_tensor(Shape{(1 << 20) + 3}, dtype, rng, {3e-22f});
    double reference = 0.0;
    for (int64_t i = 0; i < x.numel(); ++i) reference += value_at(x, i) * value_at(x, i);
    Tensor out = f32_scalar(0.0f);
    Tensor out_dev = b.to_device(out);
    b.cpu->sum_squares(x, out);
    b.gpu->sum_squares(b.to_device(x), out_dev);
    EXPECT_NEAR(out.data_as<float>()[0], reference, 1e-6 * reference) << what;
    expect_same_sum(out, b.to_host(out_dev), what);
  }

  // An FP32 result that overflows is inf on both.
  Tensor x = random_tensor(Shape{1000}, DType::kF32, rng);
  set_code(x, 10, encode(DType::kF32, 1e20f));
  Tensor out = f32_scalar(2.5f);
  Tensor out_dev = b.to_device(out);
  b.cpu->sum_squares(x, out);
  b.gpu->sum_squares(b.to_device(x), out_dev);
  EXPECT_EQ(out.data_as<float>()[0], INFINITY);
  expect_same_sum(out, b.to_host(out_dev), "sum_squares overflowing to inf");
}

TEST(GpuOps, UnscaleCheckFiniteMatchesCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(13);
  struct Bad {
    const char* name;
    std::vector<int64_t> positions;  // from the end when negative
  };
  const Bad bads[] = {{"all finite", {}}, {"last", {-1}}, {"several", {-1, 17, 500, 4}}};
  for (int64_t n : {1, 1000, 100003}) {
    for (bool misaligned : {false, true}) {
      for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
        for (const Bad& bad : bads) {
          for (float found_before : {0.0f, 1.0f}) {
            const std::string what = describe_case(
                {dtype_name(dtype), "n=" + std::to_string(n), misaligned ? "misaligned" : "",
                 bad.name, "found before " + std::to_string(found_before)});
            const int64_t offset = misaligned ? 1 : 0;
            Tensor x = random_tensor(Shape{n + offset}, dtype, rng, {1.0f, 1000.0f});
            const float specials[] = {INFINITY, NAN, -INFINITY, NAN};
            int k = 0;
            for (int64_t pos : bad.positions) {
              const int64_t i = pos < 0 ? n + pos : pos;
              if (i < n) set_code(x, offset + i, encode(dtype, specials[k++ % 4]));
            }
            Tensor x_dev = b.to_device(x);
            Tensor found = f32_scalar(found_before);
            Tensor found_dev = b.to_device(found);
            auto [first, first_dev] = b.poisoned(Shape{1}, DType::kI64);
            Tensor x_view = x.view(offset, Shape{n});
            Tensor x_dev_view = x_dev.view(offset, Shape{n});
            b.cpu->unscale_check_finite(x_view, 1.0f / 1024.0f, found, &first);
            b.gpu->unscale_check_finite(x_dev_view, 1.0f / 1024.0f, found_dev, &first_dev);
            expect_same_bits(x, b.to_host(x_dev), what + " x");
            expect_same_bits(found, b.to_host(found_dev), what + " found");
            expect_same_bits(first, b.to_host(first_dev), what + " first_index");
            // Without first_index.
            b.cpu->unscale_check_finite(x_view, 3.0f, found, nullptr);
            b.gpu->unscale_check_finite(x_dev_view, 3.0f, found_dev, nullptr);
            expect_same_bits(x, b.to_host(x_dev), what + " x, second call");
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Errors

// The message of the Error `call` throws, with what legitimately differs between the
// backends taken out: the device in tensor descriptions and the source location suffix.
template <class F>
std::string error_of(F&& call, const std::string& device_name) {
  try {
    call();
  } catch (const Error& e) {
    std::string message = e.what();
    message = message.substr(0, message.rfind(" ["));
    for (size_t at = message.find(device_name); at != std::string::npos;
         at = message.find(device_name)) {
      message.replace(at, device_name.size(), "<device>");
    }
    return message;
  }
  return "(no error)";
}

// Each bad call fails on the GPU with the CPU's message (devices aside), naming the op and
// the operand. Out-of-range tokens and targets are not among them: the GPU does not read them
// back to check them (OutOfRangeIndicesBecomeNaNWithoutASync).
TEST(GpuOps, BadCallsFailWithTheCpuMessage) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(14);
  const std::string gpu_name = b.device.str();

  // Each case gets host operands and runs on one backend, given the backend and a function
  // that moves an operand to that backend's device.
  using Move = std::function<Tensor(const Tensor&)>;
  using Case = std::function<void(Backend&, const Move&)>;
  const Tensor a = random_tensor(Shape{4, 8}, DType::kF32, rng);
  const Tensor other = random_tensor(Shape{4, 9}, DType::kF32, rng);
  const Tensor ints = tokens_tensor(Shape{4}, 5, rng);
  const std::vector<std::pair<const char*, Case>> cases = {
      {"add shapes",
       [&](Backend& be, const Move& mv) {
         Tensor o = mv(a);
         be.add(mv(a), mv(other), o);
       }},
      {"cast dtype",
       [&](Backend& be, const Move& mv) {
         Tensor o = mv(a);
         be.cast(mv(ints), o, {});
       }},
      {"gelu dtype",
       [&](Backend& be, const Move& mv) {
         Tensor o = mv(ints);
         be.gelu_forward(mv(ints), o);
       }},
      {"add_bias bias dtype",
       [&](Backend& be, const Move& mv) {
         Tensor x = mv(a);
         be.add_bias(x, mv(Tensor::empty(Shape{8}, DType::kE4M3)));
       }},
      {"add mixed dtypes",
       [&](Backend& be, const Move& mv) {
         const Tensor h = random_tensor(Shape{4, 8}, DType::kF16, rng);
         Tensor o = mv(h);
         be.add(mv(h), mv(a), o);
       }},
      {"layernorm gamma",
       [&](Backend& be, const Move& mv) {
         Tensor o = mv(a), mean = mv(a.view(0, Shape{4})), rstd = mv(a.view(4, Shape{4}));
         be.layernorm_forward(mv(a), mv(other.view(0, Shape{9})), mv(a.view(0, Shape{8})), o, mean,
                              rstd);
       }},
      {"layernorm fp8 beta",
       [&](Backend& be, const Move& mv) {
         const Tensor x = random_tensor(Shape{4, 8}, DType::kF16, rng);
         const Tensor gamma = random_tensor(Shape{8}, DType::kF16, rng);
         Tensor o = mv(x), mean = mv(a.view(0, Shape{4})), rstd = mv(a.view(4, Shape{4}));
         be.layernorm_forward(mv(x), mv(gamma), mv(Tensor::empty(Shape{8}, DType::kE5M2)), o, mean,
                              rstd);
       }},
      {"attention no channels",
       [&](Backend& be, const Move& mv) {
         Tensor o = mv(Tensor::empty(Shape{1, 2, 0}, DType::kF16));
         Tensor att = mv(random_tensor(Shape{1, 1, 2, 2}, DType::kF32, rng));
         be.attention_forward(mv(Tensor::empty(Shape{1, 2, 0}, DType::kF16)), o, att, 1);
       }},
      {"attention fp8 att",
       [&](Backend& be, const Move& mv) {
         const Tensor qkv = random_tensor(Shape{1, 2, 12}, DType::kBF16, rng);
         Tensor o = mv(random_tensor(Shape{1, 2, 4}, DType::kBF16, rng));
         Tensor att = mv(Tensor::empty(Shape{1, 2, 2, 2}, DType::kE4M3));
         be.attention_forward(mv(qkv), o, att, 2);
       }},
      {"attention heads",
       [&](Backend& be, const Move& mv) {
         const Tensor qkv = random_tensor(Shape{1, 2, 12}, DType::kF32, rng);
         Tensor o = mv(random_tensor(Shape{1, 2, 4}, DType::kF32, rng));
         Tensor att = mv(random_tensor(Shape{1, 3, 2, 2}, DType::kF32, rng));
         be.attention_forward(mv(qkv), o, att, 3);
       }},
      {"split_heads shape",
       [&](Backend& be, const Move& mv) {
         Tensor heads = mv(random_tensor(Shape{3, 1, 2, 4, 2}, DType::kF32, rng));
         be.split_heads(mv(other.reshape(Shape{1, 4, 9})), heads);
       }},
      {"causal_softmax not square",
       [&](Backend& be, const Move& mv) {
         Tensor probs = mv(other);
         be.causal_softmax_forward(mv(other), 0.5f, probs);
       }},
      {"embedding fp8 wpe",
       [&](Backend& be, const Move& mv) {
         const Tensor wte = random_tensor(Shape{50, 8}, DType::kF16, rng);
         Tensor o = mv(random_tensor(Shape{2, 6, 8}, DType::kF16, rng));
         be.embedding_forward(mv(tokens_tensor(Shape{2, 6}, 50, rng)), mv(wte),
                              mv(Tensor::empty(Shape{6, 8}, DType::kE4M3)), o);
       }},
      {"cross-entropy valid_cols",
       [&](Backend& be, const Move& mv) {
         const Tensor logits = random_tensor(Shape{12, 50}, DType::kF32, rng);
         Tensor losses = mv(random_tensor(Shape{12}, DType::kF32, rng));
         be.softmax_cross_entropy(mv(logits), 51, mv(tokens_tensor(Shape{12}, 50, rng)), losses,
                                  nullptr, 1.0f);
       }},
      {"adamw fp8 copy",
       [&](Backend& be, const Move& mv) {
         Tensor p = mv(a), g = mv(a), m = mv(a), v = mv(a);
         Tensor copy = mv(Tensor::empty(Shape{4, 8}, DType::kE4M3));
         be.adamw(p, g, m, v, &copy, std::vector<ParamRange>{{0, 32, true}}, AdamWParams{});
       }},
      {"adamw overlapping ranges",
       [&](Backend& be, const Move& mv) {
         Tensor p = mv(a), g = mv(a), m = mv(a), v = mv(a);
         const std::vector<ParamRange> ranges = {{0, 8, true}, {7, 8, false}};
         be.adamw(p, g, m, v, nullptr, ranges, AdamWParams{});
       }},
      {"unscale inv_scale",
       [&](Backend& be, const Move& mv) {
         Tensor x = mv(a), found = mv(f32_scalar(0.0f));
         be.unscale_check_finite(x, INFINITY, found, nullptr);
       }},
  };
  const Move on_cpu = [&](const Tensor& t) { return b.clone_host(t); };
  const Move on_gpu = [&](const Tensor& t) { return b.to_device(t); };
  for (const auto& [name, run] : cases) {
    const std::string cpu_message = error_of([&] { run(*b.cpu, on_cpu); }, "cpu");
    const std::string gpu_message = error_of([&] { run(*b.gpu, on_gpu); }, gpu_name);
    EXPECT_NE(cpu_message, "(no error)") << name;
    EXPECT_EQ(gpu_message, cpu_message) << name;
  }
}

}  // namespace
}  // namespace mantissa::core
