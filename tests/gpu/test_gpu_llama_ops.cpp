// The CUDA backend's Llama-style decoder ops (RMSNorm, RoPE, SwiGLU, the key/value heads of
// grouped-query attention, embeddings without a position table) against the CPU backend,
// through the Backend interface alone, from identical inputs (copied to the device with
// Backend::copy). Compared:
//  - bit for bit where both backends do the same arithmetic in the same order: RoPE (the
//    rotation of core/ops/math/rope.h, explicit fmaf), SwiGLU (core/ops/math/swiglu.h,
//    exp_f32 and explicit fmaf), the key/value heads (copies, and group sums in head order)
//    and the embedding, forward and backward, in place or not, NaN meeting NaN in F32;
//  - within a relative tolerance for RMSNorm (its row sums and dgamma run in another order):
//    |gpu - cpu| <= tol * max(|cpu|, rms(cpu)), tol 1e-5 for F32, 2e-3 for F16 and 1e-2 for
//    BF16 results.
// Outputs are poisoned with NaN first on both backends, and dgamma starts from random values
// to check that it accumulates. Shapes include odd sizes and misaligned views (the scalar
// paths) and sizes for the vectorised and grid-stride loops.
//
// Built in every build; without a CUDA device every test reports "skipped: no CUDA device".
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/ops/rope_table.h"
#include "tests/common/test_util.h"
#include "tests/gpu/gpu_compare.h"

namespace mantissa::core {
namespace {

using namespace gpu_test;

// ---------------------------------------------------------------------------------------
// RMSNorm

struct RmsNormCase {
  Shape shape;
  DType x, out, param;
};

TEST(GpuLlamaOps, RmsNormMatchesCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(21);
  const RmsNormCase cases[] = {
      {Shape{1, 8}, DType::kF32, DType::kF32, DType::kF32},
      {Shape{5, 7}, DType::kBF16, DType::kBF16, DType::kBF16},  // C % 8 != 0: scalar path
      {Shape{3, 4, 768}, DType::kBF16, DType::kBF16, DType::kF32},
      {Shape{300, 64}, DType::kF32, DType::kF32, DType::kBF16},  // two 256-row blocks
      {Shape{9, 40}, DType::kF16, DType::kF32, DType::kF32},
      {Shape{2, 33, 2048}, DType::kF16, DType::kF16, DType::kF16},
      {Shape{300, 40}, DType::kF16, DType::kF16, DType::kBF16},
      {Shape{17, 96}, DType::kF32, DType::kBF16, DType::kF32},
  };
  for (const RmsNormCase& c : cases) {
    const std::string what = c.shape.str() + " x " + dtype_name(c.x) + " out " + dtype_name(c.out) +
                             " gamma " + dtype_name(c.param);
    const int64_t C = c.shape[-1];
    const int64_t N = c.shape.numel() / C;
    const Tensor x = random_tensor(c.shape, c.x, rng, {0.1f, 1.0f, 3.0f});
    const Tensor gamma = random_tensor(Shape{C}, c.param, rng);
    const Tensor x_dev = b.to_device(x);
    const Tensor gamma_dev = b.to_device(gamma);
    auto [out, out_dev] = b.poisoned(c.shape, c.out);
    auto [rstd, rstd_dev] = b.poisoned(Shape{N}, DType::kF32);
    b.cpu->rmsnorm_forward(x, gamma, 1e-5f, out, rstd);
    b.gpu->rmsnorm_forward(x_dev, gamma_dev, 1e-5f, out_dev, rstd_dev);
    expect_close(out, b.to_host(out_dev), "rmsnorm_forward out " + what);
    expect_close(rstd, b.to_host(rstd_dev), "rmsnorm_forward rstd " + what);

    // The backward from the CPU's rstd on both backends, out of place and over dout.
    const Tensor dout = random_tensor(c.shape, c.x, rng);
    auto [dx, dx_dev] = b.poisoned(c.shape, c.x);
    Tensor dgamma = random_tensor(Shape{C}, DType::kF32, rng);
    Tensor dgamma_dev = b.to_device(dgamma);
    const Tensor rstd_on_dev = b.to_device(rstd);
    b.cpu->rmsnorm_backward(dout, x, gamma, rstd, dx, dgamma);
    b.gpu->rmsnorm_backward(b.to_device(dout), x_dev, gamma_dev, rstd_on_dev, dx_dev, dgamma_dev);
    expect_close(dx, b.to_host(dx_dev), "rmsnorm_backward dx " + what);
    expect_close(dgamma, b.to_host(dgamma_dev), "rmsnorm_backward dgamma " + what);
    Tensor in_place = b.to_device(dout);
    b.gpu->rmsnorm_backward(in_place, x_dev, gamma_dev, rstd_on_dev, in_place, dgamma_dev);
    expect_same_bits(b.to_host(dx_dev), b.to_host(in_place), "rmsnorm_backward in place " + what);
  }
}

// ---------------------------------------------------------------------------------------
// RoPE

TEST(GpuLlamaOps, RopeMatchesCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(22);
  struct Case {
    Shape shape;
    int64_t start, rotated;
    DType in, out;
  };
  const Case cases[] = {
      {Shape{1, 1, 1, 2}, 0, 1, DType::kF32, DType::kF32},
      {Shape{2, 7, 3, 64}, 0, 3, DType::kF32, DType::kF32},
      // A fused q|k|v of 8 query and 2 key/value heads: q and k rotate, v is copied.
      {Shape{2, 9, 12, 64}, 100, 10, DType::kBF16, DType::kBF16},
      {Shape{3, 5, 4, 128}, 7, 4, DType::kF16, DType::kF16},
      {Shape{1, 33, 2, 6}, 1, 1, DType::kBF16, DType::kF32},
      {Shape{4, 256, 48, 64}, 0, 32, DType::kBF16, DType::kBF16},  // grid-stride loop
  };
  for (const Case& c : cases) {
    const std::string what = c.shape.str() + " start " + std::to_string(c.start) + " rotated " +
                             std::to_string(c.rotated) + " " + dtype_name(c.in) + " -> " +
                             dtype_name(c.out);
    const int64_t D = c.shape[3];
    const Tensor table = make_rope_table(*b.cpu, 512, D, 500000.0);
    const Tensor table_dev = make_rope_table(*b.gpu, 512, D, 500000.0);
    expect_same_bits(table, b.to_host(table_dev), "rope table " + what);
    Tensor x = random_tensor(c.shape, c.in, rng, {1e-3f, 1.0f, 30.0f});
    set_code(x, 0, encode(c.in, NAN));
    const Tensor x_dev = b.to_device(x);
    for (int backward = 0; backward < 2; ++backward) {
      const std::string op = backward ? "rope_backward " : "rope_forward ";
      auto run = [&](Backend& be, const Tensor& in, const Tensor& t, Tensor& out) {
        if (backward) {
          be.rope_backward(in, t, c.start, c.rotated, out);
        } else {
          be.rope_forward(in, t, c.start, c.rotated, out);
        }
      };
      auto [out, out_dev] = b.poisoned(c.shape, c.out);
      run(*b.cpu, x, table, out);
      run(*b.gpu, x_dev, table_dev, out_dev);
      expect_same_bits(out, b.to_host(out_dev), op + what);
      if (c.in == c.out) {
        Tensor in_place = b.to_device(x);
        run(*b.gpu, in_place, table_dev, in_place);
        expect_same_bits(out, b.to_host(in_place), op + "in place " + what);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// SwiGLU

TEST(GpuLlamaOps, SwigluMatchesCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(23);
  struct Case {
    Shape gate_up;
    DType in, out;
  };
  const Case cases[] = {
      {Shape{1, 2}, DType::kF32, DType::kF32},
      {Shape{7, 2 * 13}, DType::kF32, DType::kF32},
      {Shape{2, 65, 2 * 352}, DType::kBF16, DType::kBF16},
      {Shape{33, 2 * 96}, DType::kF16, DType::kF16},
      {Shape{33, 2 * 96}, DType::kBF16, DType::kF32},
      {Shape{1024, 2 * 1536}, DType::kBF16, DType::kBF16},  // grid-stride loop
  };
  for (const Case& c : cases) {
    const std::string what = c.gate_up.str() + " " + dtype_name(c.in) + " -> " + dtype_name(c.out);
    std::vector<int64_t> out_dims = c.gate_up.dims();
    out_dims.back() /= 2;
    const Shape out_shape(out_dims);
    Tensor gate_up = random_tensor(c.gate_up, c.in, rng, {0.01f, 1.0f, 10.0f, 300.0f});
    const float specials[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 90.0f, -90.0f};
    for (int64_t i = 0; i < std::min<int64_t>(gate_up.numel(), 7); ++i)
      set_code(gate_up, i, encode(c.in, specials[i]));
    const Tensor gate_up_dev = b.to_device(gate_up);

    auto [out, out_dev] = b.poisoned(out_shape, c.out);
    b.cpu->swiglu_forward(gate_up, out);
    b.gpu->swiglu_forward(gate_up_dev, out_dev);
    expect_same_bits(out, b.to_host(out_dev), "swiglu_forward " + what);

    const Tensor dout = random_tensor(out_shape, c.out, rng);
    auto [dgu, dgu_dev] = b.poisoned(c.gate_up, c.in);
    b.cpu->swiglu_backward(dout, gate_up, dgu);
    b.gpu->swiglu_backward(b.to_device(dout), gate_up_dev, dgu_dev);
    expect_same_bits(dgu, b.to_host(dgu_dev), "swiglu_backward " + what);
    Tensor in_place = b.to_device(gate_up);
    b.gpu->swiglu_backward(b.to_device(dout), in_place, in_place);
    expect_same_bits(dgu, b.to_host(in_place), "swiglu_backward in place " + what);
  }
}

TEST(GpuLlamaOps, KvHeadsMatchCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(24);
  struct Case {
    int64_t B, T, H, KV, D;
    DType dtype;
  };
  const Case cases[] = {
      {1, 3, 4, 2, 6, DType::kF32},
      {2, 5, 6, 1, 4, DType::kBF16},
      {2, 7, 8, 4, 64, DType::kF16},
      {4, 256, 32, 8, 64, DType::kBF16},  // grid-stride
  };
  for (const Case& c : cases) {
    const std::string what =
        "H " + std::to_string(c.H) + " KV " + std::to_string(c.KV) + " " + dtype_name(c.dtype);
    const Shape grouped{c.B, c.T, (c.H + 2 * c.KV) * c.D}, expanded{c.B, c.T, 3 * c.H * c.D};
    const Tensor qkv = random_tensor(grouped, c.dtype, rng);
    auto [out, out_dev] = b.poisoned(expanded, c.dtype);
    b.cpu->repeat_kv_heads(qkv, c.H, c.KV, out);
    b.gpu->repeat_kv_heads(b.to_device(qkv), c.H, c.KV, out_dev);
    expect_same_bits(out, b.to_host(out_dev), "repeat_kv_heads " + what);

    const Tensor dout = random_tensor(expanded, c.dtype, rng);
    auto [dqkv, dqkv_dev] = b.poisoned(grouped, c.dtype);
    b.cpu->repeat_kv_heads_backward(dout, c.H, c.KV, dqkv);
    b.gpu->repeat_kv_heads_backward(b.to_device(dout), c.H, c.KV, dqkv_dev);
    expect_same_bits(dqkv, b.to_host(dqkv_dev), "repeat_kv_heads_backward " + what);
  }
}

TEST(GpuLlamaOps, EmbeddingWithoutPositionsMatchesCpuBitForBit) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(25);
  const int64_t B = 3, T = 37, V = 50, C = 96;
  Tensor tokens = Tensor::empty(Shape{B, T}, DType::kI32);
  for (int64_t i = 0; i < B * T; ++i)
    tokens.data_as<int32_t>()[i] = static_cast<int32_t>(rng() % V);
  const Tensor tokens_dev = b.to_device(tokens);
  const Tensor wte = random_tensor(Shape{V, C}, DType::kBF16, rng);
  auto [out, out_dev] = b.poisoned(Shape{B, T, C}, DType::kBF16);
  b.cpu->embedding_forward(tokens, wte, Tensor(), out);
  b.gpu->embedding_forward(tokens_dev, b.to_device(wte), Tensor(), out_dev);
  expect_same_bits(out, b.to_host(out_dev), "embedding_forward without wpe");

  const Tensor dout = random_tensor(Shape{B, T, C}, DType::kBF16, rng);
  Tensor dwte = random_tensor(Shape{V, C}, DType::kF32, rng);
  Tensor dwte_dev = b.to_device(dwte);
  Tensor none, none_dev;
  b.cpu->embedding_backward(dout, tokens, dwte, none);
  b.gpu->embedding_backward(b.to_device(dout), tokens_dev, dwte_dev, none_dev);
  expect_same_bits(dwte, b.to_host(dwte_dev), "embedding_backward without dwpe");
}

// Misaligned views take the scalar paths; the same bits (RoPE, SwiGLU) or values within
// tolerance (RMSNorm) as the CPU.
TEST(GpuLlamaOps, MisalignedViewsMatchCpu) {
  if (!cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  Backends b;
  std::mt19937_64 rng(24);
  const int64_t N = 37, C = 64;
  const Tensor storage = random_tensor(Shape{N * C + 1}, DType::kBF16, rng);
  const Tensor x = b.clone_host(storage).view(1, Shape{N, C});
  const Tensor x_dev = b.to_device(storage).view(1, Shape{N, C});
  const Tensor gamma = random_tensor(Shape{C}, DType::kF32, rng);
  auto [out, out_dev] = b.poisoned(Shape{N, C}, DType::kBF16);
  auto [rstd, rstd_dev] = b.poisoned(Shape{N}, DType::kF32);
  b.cpu->rmsnorm_forward(x, gamma, 1e-6f, out, rstd);
  b.gpu->rmsnorm_forward(x_dev, b.to_device(gamma), 1e-6f, out_dev, rstd_dev);
  expect_close(out, b.to_host(out_dev), "rmsnorm_forward misaligned");

  const Tensor table = make_rope_table(*b.cpu, N, 8, 10000.0);
  const Tensor table_dev = b.to_device(table);
  auto [q, q_dev] = b.poisoned(Shape{1, N, 8, 8}, DType::kBF16);
  b.cpu->rope_forward(x.reshape(Shape{1, N, 8, 8}), table, 0, 8, q);
  b.gpu->rope_forward(x_dev.reshape(Shape{1, N, 8, 8}), table_dev, 0, 8, q_dev);
  expect_same_bits(q, b.to_host(q_dev), "rope_forward misaligned");

  auto [h, h_dev] = b.poisoned(Shape{N, C / 2}, DType::kBF16);
  b.cpu->swiglu_forward(x, h);
  b.gpu->swiglu_forward(x_dev, h_dev);
  expect_same_bits(h, b.to_host(h_dev), "swiglu_forward misaligned");
}

}  // namespace
}  // namespace mantissa::core
