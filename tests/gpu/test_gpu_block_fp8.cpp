// The CUDA backend's block-scaled FP8 ops against the CPU backend:
//  - quantize_blocks: the same codes, scales and amax bit for bit (both run the scalar rules
//    of core/precision/block_scaling.h), for every mode, source dtype, FP8 format, with and
//    without the transpose, on activations and on blocks of special values (zeros,
//    subnormals, extremes, FP8 ties, inf and NaN);
//  - gemm with scale modes: within fp8_product_tolerance of the CPU (cuBLASLt's
//    accumulation is not documented; the codes and scales are identical), where the
//    device runs the pair (unsupported_scale_modes says "" there); elsewhere the call must
//    fail naming the reason, never fall back to per-tensor scales.
// Built in every build; without a CUDA device every test reports "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <utility>

#include "core/error.h"
#include "tests/common/block_sources.h"
#include "tests/gpu/gpu_compare.h"

namespace mantissa::core {
namespace {

using gpu_test::Backends;

// How close a block-scaled FP8 product must come to the CPU's, relative to max(|value|, rms):
// the output dtype's tolerance, but at least 2e-3. Hopper's FP8 tensor cores do not sum in
// full FP32 (DeepSeek-V3, section 3.3.2: about 14 bits are kept, the reason block scaling
// promotes each 128-element partial sum to FP32). Emulating that (each 32-product step aligned
// to the largest exponent and truncated to 13 fraction bits) puts this file's products up to
// 4.5e-4 from the CPU's exact-product FP32 sums, well past F32's 1e-5; a wrong scale or layout
// moves them far more (rows differ in magnitude by up to 2^16, and one K-block of each row
// holds a 1000x outlier).
double fp8_product_tolerance(DType out) {
  return std::max(gpu_test::tolerance(out), 2e-3);
}

constexpr ScaleMode kModes[] = {ScaleMode::kVec128, ScaleMode::kBlock128, ScaleMode::kOuterVec,
                                ScaleMode::kVec32Ue8m0};

// Gaussian rows of magnitudes 2^-8 .. 2^8, one outlier column 1000x larger, one zero block.
Tensor activations(const Shape& shape, DType dtype, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-8, 8);
  Tensor t = Tensor::empty(shape, dtype);
  for (int64_t r = 0; r < shape[0]; ++r) {
    const float magnitude = std::ldexp(1.0f, exponent(rng));
    for (int64_t c = 0; c < shape[1]; ++c) {
      float v = normal(rng) * magnitude * (c == 3 ? 1000.0f : 1.0f);
      if (r < 32 && c >= 128 && c < 256) v = 0.0f;
      set_value(t, r * shape[1] + c, v);
    }
  }
  return t;
}

struct Quantized {
  Tensor codes, scales, amax;
};

Quantized quantize(Backend& be, Device device, const Tensor& src, DType code,
                   BlockQuantizeParams p) {
  const int64_t outer = src.dim(p.transpose ? 1 : 0), k = src.dim(p.transpose ? 0 : 1);
  Quantized q{Tensor::empty(Shape{outer, k}, code, device),
              Tensor::empty(Shape{scale_count(p.mode, outer, k)}, scale_dtype(p.mode), device),
              Tensor::empty(Shape{1}, DType::kF32, device)};
  p.amax = &q.amax;
  be.quantize_blocks(src, q.codes, q.scales, p);
  return q;
}

TEST(GpuBlockFp8, QuantizeMatchesTheCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  for (const Shape& shape : {Shape{260, 384}, Shape{136, 400}, Shape{2048, 1536}}) {
    for (DType src_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      // Activations with an outlier channel; then blocks of zeros, subnormals, extremes and
      // FP8 ties, without and with inf and NaN.
      const std::pair<std::string, Tensor> sources[] = {
          {"activations", activations(shape, src_dtype, 31)},
          {"special", special_source(shape, src_dtype, 32, false)},
          {"non-finite", special_source(shape, src_dtype, 33, true)}};
      for (const auto& [source_name, host] : sources) {
        const Tensor dev = b.to_device(host);
        for (ScaleMode mode : kModes) {
          for (bool transpose : {false, true}) {
            for (DType code : {DType::kE4M3, DType::kE5M2}) {
              BlockQuantizeParams p;
              p.mode = mode;
              p.transpose = transpose;
              p.power_of_two = shape[0] == 136;
              const std::string what = std::string(scale_mode_name(mode)) + " " +
                                       dtype_name(src_dtype) + "->" + dtype_name(code) +
                                       (transpose ? " transposed " : " ") + shape.str() + " " +
                                       source_name;
              const Quantized cpu = quantize(*b.cpu, Device::cpu(), host, code, p);
              const Quantized gpu = quantize(*b.gpu, b.device, dev, code, p);
              gpu_test::expect_same_bits(cpu.codes, b.to_host(gpu.codes), what + " codes");
              gpu_test::expect_same_bits(cpu.scales, b.to_host(gpu.scales), what + " scales");
              gpu_test::expect_same_bits(cpu.amax, b.to_host(gpu.amax), what + " amax");
            }
          }
        }
      }
    }
  }
}

struct Pair {
  ScaleMode a, b;
};

// The three GEMMs of a Linear layer at the reference model's fc shape (x [2048, 384],
// W [1536, 384]) in every pair of scale modes, TN as the layer calls them, plus one call with
// both operands stored the other way (the CUDA backend transposes FP8 operands into the TN
// layout; the scale layouts do not change with it).
TEST(GpuBlockFp8, ScaledGemmMatchesTheCpuOrRefusesWithTheReason) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  const Pair pairs[] = {{ScaleMode::kVec128, ScaleMode::kVec128},
                        {ScaleMode::kVec128, ScaleMode::kBlock128},
                        {ScaleMode::kBlock128, ScaleMode::kVec128},
                        {ScaleMode::kOuterVec, ScaleMode::kOuterVec},
                        {ScaleMode::kVec32Ue8m0, ScaleMode::kVec32Ue8m0}};
  const int64_t m = 2048, n = 1536, k = 384;
  const Tensor a_src = activations(Shape{m, k}, DType::kBF16, 32);
  const Tensor b_src = activations(Shape{n, k}, DType::kBF16, 33);
  for (Pair pair : pairs) {
    const std::string name = std::string(scale_mode_name(pair.a)) + " x " + scale_mode_name(pair.b);
    for (bool stored_other_way : {false, true}) {
      BlockQuantizeParams pa, pb;
      pa.mode = pair.a;
      pb.mode = pair.b;
      // Quantised on the CPU (checked equal to the GPU's above), then copied over.
      const Quantized qa = quantize(*b.cpu, Device::cpu(), a_src, DType::kE4M3, pa);
      const Quantized qb = quantize(*b.cpu, Device::cpu(), b_src, DType::kE4M3, pb);
      Tensor a_codes = qa.codes, b_codes = qb.codes;
      GemmParams p;
      p.trans_b = true;
      if (stored_other_way) {
        // A stored [K, M] and B stored [K, N]: the same operands, transposed on the host.
        a_codes = Tensor::empty(Shape{k, m}, DType::kE4M3);
        b_codes = Tensor::empty(Shape{k, n}, DType::kE4M3);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t kk = 0; kk < k; ++kk)
            set_code(a_codes, kk * m + i, code_at(qa.codes, i * k + kk));
        for (int64_t j = 0; j < n; ++j)
          for (int64_t kk = 0; kk < k; ++kk)
            set_code(b_codes, kk * n + j, code_at(qb.codes, j * k + kk));
        p.trans_a = true;
        p.trans_b = false;
      }
      p.a_scale_mode = pair.a;
      p.b_scale_mode = pair.b;
      for (DType out : {DType::kF32, DType::kBF16}) {
        const std::string what =
            name + " -> " + dtype_name(out) + (stored_other_way ? " (A, B stored transposed)" : "");
        auto [c_cpu, c_gpu] = b.poisoned(Shape{m, n}, out);
        p.a_scale = &qa.scales;
        p.b_scale = &qb.scales;
        b.cpu->gemm(a_codes, b_codes, c_cpu, p);
        const Tensor a_dev = b.to_device(a_codes), b_dev = b.to_device(b_codes);
        const Tensor sa_dev = b.to_device(qa.scales), sb_dev = b.to_device(qb.scales);
        p.a_scale = &sa_dev;
        p.b_scale = &sb_dev;
        const std::string unsupported = b.gpu->unsupported_scale_modes(pair.a, pair.b);
        if (!unsupported.empty()) {
          try {
            b.gpu->gemm(a_dev, b_dev, c_gpu, p);
            ADD_FAILURE() << what << ": ran although the device reports \"" << unsupported << "\"";
          } catch (const Error& e) {
            EXPECT_NE(std::string(e.what()).find(unsupported), std::string::npos) << e.what();
          }
          std::printf("%s: not on this device: %s\n", what.c_str(), unsupported.c_str());
          continue;
        }
        b.gpu->gemm(a_dev, b_dev, c_gpu, p);
        gpu_test::expect_close(c_cpu, b.to_host(c_gpu), fp8_product_tolerance(out), what);
      }
    }
  }
}

// The weight gradient of the BLOCKWISE and ROWWISE recipes (models/nn/linear.cpp):
// dW[out, in] += dy^T x with both operands quantised transposed, so K is the token count, and
// beta = 1 into the F32 gradient, which the test above (beta = 0) never asks cuBLASLt for.
// K = 2000 is a token count that is no multiple of 128: ROWWISE trains with it, BLOCKWISE
// refuses it at validation (launcher/config/config_validate.cpp: its K are whole 128-element
// blocks), so VEC128 is asked only for K = 2048, the shape training can give it.
TEST(GpuBlockFp8, ScaledWeightGradientAccumulatesWithBetaOne) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  const int64_t out = 1536, in = 384;
  for (int64_t tokens : {int64_t{2048}, int64_t{2000}}) {
    const Tensor dy = activations(Shape{tokens, out}, DType::kBF16, 34);
    const Tensor x = activations(Shape{tokens, in}, DType::kBF16, 35);
    for (ScaleMode mode : {ScaleMode::kVec128, ScaleMode::kOuterVec}) {
      if (mode == ScaleMode::kVec128 && tokens % 128 != 0) continue;
      const std::string what = std::string(scale_mode_name(mode)) +
                               " weight gradient, K = " + std::to_string(tokens) +
                               ", beta 1 into f32";
      BlockQuantizeParams q;
      q.mode = mode;
      q.transpose = true;
      const Quantized dyt = quantize(*b.cpu, Device::cpu(), dy, DType::kE4M3, q);
      const Quantized xt = quantize(*b.cpu, Device::cpu(), x, DType::kE4M3, q);
      GemmParams p;
      p.trans_b = true;
      p.a_scale_mode = mode;
      p.b_scale_mode = mode;
      p.a_scale = &dyt.scales;
      p.b_scale = &xt.scales;
      // The gradient so far: random values as large as the product (rms), equal on both sides,
      // so that a beta ignored or applied twice moves the result by about its rms, 500 times
      // the tolerance (values of 1 would vanish under it: the product's rms is about 2e5).
      Tensor product = Tensor::empty(Shape{out, in}, DType::kF32);
      b.cpu->gemm(dyt.codes, xt.codes, product, p);
      std::mt19937_64 rng(36);
      const Tensor grad0 = gpu_test::random_tensor(Shape{out, in}, DType::kF32, rng,
                                                   {static_cast<float>(gpu_test::rms_of(product))});
      Tensor c_cpu = b.clone_host(grad0);
      Tensor c_gpu = b.to_device(grad0);
      p.beta = 1.0f;
      b.cpu->gemm(dyt.codes, xt.codes, c_cpu, p);
      const Tensor a_dev = b.to_device(dyt.codes), b_dev = b.to_device(xt.codes);
      const Tensor sa_dev = b.to_device(dyt.scales), sb_dev = b.to_device(xt.scales);
      p.a_scale = &sa_dev;
      p.b_scale = &sb_dev;
      const std::string unsupported = b.gpu->unsupported_scale_modes(mode, mode);
      if (!unsupported.empty()) {
        std::printf("%s: not on this device: %s\n", what.c_str(), unsupported.c_str());
        continue;
      }
      b.gpu->gemm(a_dev, b_dev, c_gpu, p);
      gpu_test::expect_close(c_cpu, b.to_host(c_gpu), fp8_product_tolerance(DType::kF32), what);
    }
  }
}

}  // namespace
}  // namespace mantissa::core
