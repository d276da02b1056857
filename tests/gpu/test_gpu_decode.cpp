// Text generation on the CUDA backend against the CPU backend:
//  - attention_decode, op by op: the same calls (a prompt of several rows, then one row at a
//    time) from identical inputs give the same caches bit for bit (a copy into the same dtype)
//    and outputs within test_gpu_ops.cpp's tolerances (FP32 1e-5, F16 2e-3, BF16 1e-2
//    relative to max(|cpu|, rms)), for heads narrower and wider than a block, many heads, and
//    a long context (one past the default 48 KiB of shared memory, which the kernel opts in
//    to); the device's shared-memory limit is an error, not a wrong result;
//  - GPT2Decoder and LlamaDecoder with the same weights on both backends: the cached logits of
//    every step agree within 1e-4 (cuBLASLt against OpenBLAS through a few layers), and on the
//    GPU the cached logits equal those of the full forward within 1e-5.
//
// Built in every build; without a CUDA device every test reports "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_decoder.h"
#include "models/llama/llama.h"
#include "models/llama/llama_decoder.h"
#include "tests/common/test_util.h"

namespace mantissa::models {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

Tensor to_device(core::Backend& gpu, const Tensor& host) {
  Tensor t = Tensor::empty(host.shape(), host.dtype(), gpu.device());
  gpu.copy(host, t);
  return t;
}

Tensor to_host(core::Backend& gpu, const Tensor& on_device) {
  Tensor t = Tensor::empty(on_device.shape(), on_device.dtype());
  gpu.copy(on_device, t);
  gpu.synchronize();
  return t;
}

Tensor random_tensor(const Shape& shape, DType dtype, std::mt19937_64& rng, float std) {
  Tensor t = Tensor::empty(shape, dtype);
  std::normal_distribution<float> normal(0.0f, std);
  for (int64_t i = 0; i < t.numel(); ++i) core::set_value(t, i, normal(rng));
  return t;
}

// |gpu - cpu| <= tol * max(|cpu|, rms(cpu)).
void expect_close(const Tensor& cpu, const Tensor& gpu, double tol, const std::string& what) {
  ASSERT_EQ(cpu.numel(), gpu.numel()) << what;
  const std::vector<double> e = core::values_of(cpu), a = core::values_of(gpu);
  double squares = 0.0;
  for (const double v : e) squares += v * v;
  const double rms = std::sqrt(squares / static_cast<double>(std::max<size_t>(1, e.size())));
  int64_t mismatches = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    if (std::fabs(a[i] - e[i]) <= tol * std::max(std::fabs(e[i]), rms)) continue;
    if (++mismatches <= 5) {
      ADD_FAILURE() << what << ": element " << i << " is " << a[i] << " on the GPU, " << e[i]
                    << " on the CPU (tolerance " << tol << ", rms " << rms << ")";
    }
  }
  EXPECT_EQ(mismatches, 0) << what << ": elements out of tolerance, of " << e.size();
}

double tolerance(DType dtype) {
  return dtype == DType::kBF16 ? 1e-2 : dtype == DType::kF16 ? 2e-3 : 1e-5;
}

TEST(GpuDecode, AttentionDecodeMatchesCpu) {
  if (!core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  auto cpu = core::make_cpu_backend();
  auto gpu = core::make_cuda_backend(0);
  std::mt19937_64 rng(14);
  struct Case {
    int64_t T, C;
    int n_head;
    DType dtype;
    int64_t prompt;  // rows of the first call; then one row per call
  };
  const Case cases[] = {
      {1, 4, 1, DType::kF32, 1},
      {9, 12, 3, DType::kF32, 4},
      {40, 768, 12, DType::kF32, 1},
      {70, 400, 2, DType::kF32, 7},  // D = 200 > the block
      {1024, 768, 12, DType::kF32, 1000},
      {70, 96, 2, DType::kBF16, 10},
      {65, 192, 3, DType::kF16, 1},
      {13000, 8, 1, DType::kF32, 12990},  // 52 KB of scores: past the default 48 KiB
  };
  for (const Case& c : cases) {
    const std::string what = "T=" + std::to_string(c.T) + " C=" + std::to_string(c.C) +
                             " H=" + std::to_string(c.n_head) + " " + core::dtype_name(c.dtype);
    const Tensor qkv = random_tensor(Shape{c.T, 3 * c.C}, c.dtype, rng, 1.5f);
    const Tensor qkv_dev = to_device(*gpu, qkv);
    const Shape cache_shape{c.T + 2, c.C};
    Tensor k = Tensor::empty(cache_shape, c.dtype), v = Tensor::empty(cache_shape, c.dtype);
    Tensor k_dev = Tensor::empty(cache_shape, c.dtype, gpu->device());
    Tensor v_dev = Tensor::empty(cache_shape, c.dtype, gpu->device());
    Tensor out = Tensor::empty(Shape{c.T, c.C}, c.dtype);
    Tensor out_dev = Tensor::empty(Shape{c.T, c.C}, c.dtype, gpu->device());
    cpu->fill(k, 0.0f);
    cpu->fill(v, 0.0f);
    gpu->fill(k_dev, 0.0f);
    gpu->fill(v_dev, 0.0f);
    cpu->fill(out, NAN);
    gpu->fill(out_dev, NAN);
    for (int64_t start = 0; start < c.T;) {
      const int64_t n = start == 0 ? c.prompt : 1;
      Tensor rows = out.view(start * c.C, Shape{n, c.C});
      Tensor rows_dev = out_dev.view(start * c.C, Shape{n, c.C});
      cpu->attention_decode(qkv.view(start * 3 * c.C, Shape{n, 3 * c.C}), k, v, rows, c.n_head,
                            start);
      gpu->attention_decode(qkv_dev.view(start * 3 * c.C, Shape{n, 3 * c.C}), k_dev, v_dev,
                            rows_dev, c.n_head, start);
      start += n;
    }
    expect_close(out, to_host(*gpu, out_dev), tolerance(c.dtype), "attention_decode out " + what);
    const Tensor k_back = to_host(*gpu, k_dev), v_back = to_host(*gpu, v_dev);
    EXPECT_EQ(std::memcmp(k.data(), k_back.data(), k.nbytes()), 0) << "k_cache " << what;
    EXPECT_EQ(std::memcmp(v.data(), v_back.data(), v.nbytes()), 0) << "v_cache " << what;
  }
}

TEST(GpuDecode, AttentionDecodeRefusesMorePositionsThanSharedMemoryHolds) {
  if (!core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  auto gpu = core::make_cuda_backend(0);
  Tensor qkv = Tensor::empty(Shape{1, 12}, DType::kF32, gpu->device());
  // 65,000 positions need 260 KB, past the opt-in shared memory of every GPU so far (Hopper
  // and Blackwell 227 KiB, Ampere 163 KiB).
  Tensor k = Tensor::empty(Shape{65000, 4}, DType::kF32, gpu->device());
  Tensor v = Tensor::empty(Shape{65000, 4}, DType::kF32, gpu->device());
  Tensor out = Tensor::empty(Shape{1, 4}, DType::kF32, gpu->device());
  core::expect_error([&] { gpu->attention_decode(qkv, k, v, out, 1, 64999); },
                     {"attention_decode", "above the CUDA backend's limit"});
}

// N(0, 0.1) weights from a fixed seed, the same on every backend.
void set_normal_weights(train::ParameterStore& params, core::Backend& backend) {
  std::mt19937_64 rng(15);
  std::normal_distribution<float> normal(0.0f, 0.1f);
  Tensor weights = Tensor::empty(Shape{params.flat_numel()}, DType::kF32);
  for (int64_t i = 0; i < weights.numel(); ++i) weights.data_as<float>()[i] = 0.0f;
  for (const train::Parameter& p : params.all()) {
    for (int64_t i = 0; i < p.numel(); ++i) weights.data_as<float>()[p.offset + i] = normal(rng);
  }
  params.set_weights(backend, weights);
}

const auto kFP32 = core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32);

std::unique_ptr<GPT2> tiny_gpt2(core::Backend& backend) {
  auto model = std::make_unique<GPT2>(GPT2Config{3, 4, 128, 48, 300}, backend, kFP32, 5);
  set_normal_weights(model->parameters(), backend);
  return model;
}

// 4 query heads sharing 2 key/value heads of 32 channels, an untied head.
std::unique_ptr<Llama> tiny_llama(core::Backend& backend) {
  LlamaConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 128;
  c.ffn_hidden = 192;
  c.seq_len = 48;
  c.vocab_size = 300;
  auto model = std::make_unique<Llama>(c, backend, kFP32, 5);
  set_normal_weights(model->parameters(), backend);
  return model;
}

// A prompt of 9, then one token at a time, to the end of the 48-position window: the cached
// logits on the GPU against the CPU's (1e-4) and against the GPU's full forward (1e-5).
void expect_cached_logits_match(Decoder& on_cpu, Decoder& on_gpu, const std::string& model) {
  core::Backend& gpu = on_gpu.backend();
  const int64_t V = on_gpu.vocab_size();
  std::vector<int32_t> tokens(48);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % V);

  const Tensor full = to_host(gpu, on_gpu.full_logits(tokens));
  for (int64_t t = 0; t < 48;) {
    const int64_t n = t == 0 ? 9 : 1;
    const std::span<const int32_t> step =
        std::span(tokens).subspan(static_cast<size_t>(t), static_cast<size_t>(n));
    const Tensor expected = on_cpu.append(step);
    const Tensor actual = to_host(gpu, on_gpu.append(step));
    t += n;
    const std::string what = model + ", position " + std::to_string(t - 1);
    expect_close(expected, actual, 1e-4, "cached logits, GPU vs CPU, " + what);
    expect_close(full.view((t - 1) * V, Shape{V}), actual, 1e-5,
                 "GPU cached vs full forward, " + what);
  }
}

TEST(GpuDecode, CachedLogitsMatchCpuAndTheFullForward) {
  if (!core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  auto cpu = core::make_cpu_backend();
  auto gpu = core::make_cuda_backend(0);
  const auto cpu_model = tiny_gpt2(*cpu);
  const auto gpu_model = tiny_gpt2(*gpu);
  GPT2Decoder on_cpu(*cpu_model, *cpu), on_gpu(*gpu_model, *gpu);
  expect_cached_logits_match(on_cpu, on_gpu, "GPT-2");
}

// Grouped-query attention, RoPE at the cached positions and the untied head, end to end.
TEST(GpuDecode, LlamaCachedLogitsMatchCpuAndTheFullForward) {
  if (!core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  auto cpu = core::make_cpu_backend();
  auto gpu = core::make_cuda_backend(0);
  const auto cpu_model = tiny_llama(*cpu);
  const auto gpu_model = tiny_llama(*gpu);
  LlamaDecoder on_cpu(*cpu_model, *cpu), on_gpu(*gpu_model, *gpu);
  expect_cached_logits_match(on_cpu, on_gpu, "Llama");
}

}  // namespace
}  // namespace mantissa::models
