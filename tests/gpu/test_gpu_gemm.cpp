// CudaBackend::gemm (and the backend's memory ops) against the CPU backend.
//
// Every test draws random operands, rounds them into the operand dtypes on the host, and runs
// the same call on both backends. The CPU is the reference: it widens operands exactly and
// accumulates in FP32, as cuBLASLt does, so the two differ only by summation order (and by
// one rounding step of the output where that order moves a value across a rounding
// boundary). Tolerances are relative to the largest reference magnitude:
//   F32 x F32 -> F32                  1e-5 (full FP32; fails if TF32 sneaks in)
//   BF16/F16 x same -> F32            1e-4 (tensor-core FP32 accumulation is not IEEE-rounded
//                                          at every step)
//   -> F16                            2e-3 (one F16 step is at most 2^-10 of the maximum,
//                                          and F16's subnormals sit far below it)
//   -> BF16                           1e-2 (one BF16 step is at most 2^-7 of the maximum)
//   FP8 operands -> F32               2e-3 (Hopper's FP8 MMA keeps about 14 bits of its sums;
//                                          cuBLASLt promotes the partial sums to FP32, which
//                                          leaves them within 4.5e-4 of the exact ones, see
//                                          test_gpu_block_fp8.cpp)
//   -> BF16                           1e-2 (its rounding step)
//   with fast accumulation            6e-2 (the 14 bits along all of K: DeepSeek-V3 measured up
//                                          to 2% at K = 4096)
//   -> FP8                            at least 95% of the codes equal, the rest one step
//                                     apart (a sum near a rounding boundary may land on either
//                                     side; truncation or a bias moves about half), amax
//                                     within 1e-2
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops/backend.h"
#include "tests/gpu/gpu_compare.h"

namespace mantissa::core {
namespace {

// ---------------------------------------------------------------------------------------
// Host helpers.

// Values rounded into `t`'s dtype (to nearest even, FP8 saturating).
void store(Tensor& t, const std::vector<float>& values) {
  ASSERT_EQ(static_cast<int64_t>(values.size()), t.numel());
  for (size_t i = 0; i < values.size(); ++i) {
    const float v = values[i];
    switch (t.dtype()) {
      case DType::kF32: t.data_as<float>()[i] = v; break;
      case DType::kBF16: t.data_as<bf16>()[i] = bf16_from_float(v); break;
      case DType::kF16: t.data_as<fp16>()[i] = fp16_from_float(v); break;
      case DType::kE4M3: t.data_as<fp8_e4m3>()[i] = e4m3_from_float(v); break;
      case DType::kE5M2: t.data_as<fp8_e5m2>()[i] = e5m2_from_float(v); break;
      default: FAIL() << "store: unsupported dtype " << dtype_name(t.dtype());
    }
  }
}

std::vector<float> load(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < out.size(); ++i) {
    switch (t.dtype()) {
      case DType::kF32: out[i] = t.data_as<const float>()[i]; break;
      case DType::kBF16: out[i] = to_float(t.data_as<const bf16>()[i]); break;
      case DType::kF16: out[i] = to_float(t.data_as<const fp16>()[i]); break;
      case DType::kE4M3: out[i] = to_float(t.data_as<const fp8_e4m3>()[i]); break;
      case DType::kE5M2: out[i] = to_float(t.data_as<const fp8_e5m2>()[i]); break;
      default: ADD_FAILURE() << "load: unsupported dtype " << dtype_name(t.dtype()); break;
    }
  }
  return out;
}

std::vector<float> uniform(int64_t n, float range, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-range, range);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

Tensor host_tensor(const Shape& shape, DType dtype, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, dtype);
  store(t, values);
  return t;
}

Tensor to_device(Backend& gpu, const Tensor& host) {
  Tensor d = Tensor::empty(host.shape(), host.dtype(), gpu.device());
  gpu.copy(host, d);
  return d;
}

Tensor to_host(Backend& gpu, const Tensor& device) {
  Tensor h = Tensor::empty(device.shape(), device.dtype());
  gpu.copy(device, h);
  gpu.synchronize();
  return h;
}

// max |got - want| / max |want| (0 when both are all zeros); infinite where one of them is
// not finite and the other is not the same (std::max would pass over a NaN difference, and a C
// the GPU never wrote, still the NaN it started as, would compare equal).
double max_relative_error(const std::vector<float>& got, const std::vector<float>& want) {
  double diff = 0.0;
  double scale = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      const bool same = got[i] == want[i] || (std::isnan(got[i]) && std::isnan(want[i]));
      if (!same) return INFINITY;
      continue;
    }
    diff = std::max(diff, std::fabs(static_cast<double>(got[i]) - want[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(want[i])));
  }
  return scale == 0.0 ? diff : diff / scale;
}

// How FP8 codes compare: how many differ at all, and how many by more than one rounding step
// (codes of one sign order like their magnitudes; across zero both must be within one step of
// it).
struct Fp8CodesApart {
  int64_t differ = 0;
  int64_t beyond_one_step = 0;
};
Fp8CodesApart fp8_codes_apart(const Tensor& got, const Tensor& want) {
  const auto* g = static_cast<const uint8_t*>(got.data());
  const auto* w = static_cast<const uint8_t*>(want.data());
  Fp8CodesApart apart;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const int gm = g[i] & 0x7F;
    const int wm = w[i] & 0x7F;
    const bool near = (g[i] & 0x80) == (w[i] & 0x80) ? std::abs(gm - wm) <= 1 : gm + wm <= 1;
    apart.differ += g[i] == w[i] ? 0 : 1;
    apart.beyond_one_step += near ? 0 : 1;
  }
  return apart;
}

// ---------------------------------------------------------------------------------------
// One GEMM on both backends.

struct GemmCase {
  int64_t batch = 0;  // 0: 2-D operands
  int64_t m = 0, n = 0, k = 0;
  bool trans_a = false, trans_b = false;
  DType a = DType::kF32, b = DType::kF32, c = DType::kF32;
  float alpha = 1.0f, beta = 0.0f;
  bool fast_accumulate = false;
  bool nan_operands = false;  // a NaN in A and in B, which alpha = 0 must not read
  double tolerance = 1e-5;

  std::string name() const {
    return std::string(dtype_name(a)) + "x" + dtype_name(b) + "->" + dtype_name(c) + " b" +
           std::to_string(batch) + " m" + std::to_string(m) + " n" + std::to_string(n) + " k" +
           std::to_string(k) + (trans_a ? " A^T" : "") + (trans_b ? " B^T" : "") + " alpha " +
           std::to_string(alpha) + " beta " + std::to_string(beta) +
           (fast_accumulate ? " fast" : "");
  }
};

Shape matrix_shape(int64_t batch, int64_t rows, int64_t cols) {
  return batch > 0 ? Shape{batch, rows, cols} : Shape{rows, cols};
}

// FP8 codes span most of their range; the scale brings values back to about [-1, 1].
float code_range(DType dtype) {
  switch (dtype) {
    case DType::kE4M3: return 200.0f;
    case DType::kE5M2: return 10000.0f;
    default: return 1.0f;
  }
}

Tensor scalar(float value) {
  return host_tensor(Shape{1}, DType::kF32, {value});
}

class GemmHarness {
 public:
  GemmHarness() : cpu_(make_cpu_backend()), gpu_(make_cuda_backend(0)) {}
  Backend& gpu() { return *gpu_; }
  Backend& cpu() { return *cpu_; }

  // Runs the case on both backends and checks the GPU result (and amax) against the CPU's.
  void check(const GemmCase& cs, uint32_t seed = 1) {
    SCOPED_TRACE(cs.name());
    const int64_t batches = std::max<int64_t>(cs.batch, 1);
    const Shape a_shape =
        cs.trans_a ? matrix_shape(cs.batch, cs.k, cs.m) : matrix_shape(cs.batch, cs.m, cs.k);
    const Shape b_shape =
        cs.trans_b ? matrix_shape(cs.batch, cs.n, cs.k) : matrix_shape(cs.batch, cs.k, cs.n);
    const Shape c_shape = matrix_shape(cs.batch, cs.m, cs.n);
    const float range_a = code_range(cs.a);
    const float range_b = code_range(cs.b);
    Tensor a = host_tensor(a_shape, cs.a, uniform(batches * cs.m * cs.k, range_a, seed));
    Tensor b = host_tensor(b_shape, cs.b, uniform(batches * cs.k * cs.n, range_b, seed + 1));
    if (cs.nan_operands) {
      set_value(a, 0, NAN);
      set_value(b, b.numel() - 1, NAN);
    }
    // With beta = 0 the old C must not be read: start from NaN everywhere to prove it.
    const std::vector<float> c0 =
        cs.beta == 0.0f ? std::vector<float>(static_cast<size_t>(c_shape.numel()), NAN)
                        : uniform(c_shape.numel(), 1.0f, seed + 2);

    const bool fp8 = is_fp8(cs.a);
    const bool fp8_out = is_fp8(cs.c);
    const Tensor a_scale = scalar(1.0f / range_a);
    const Tensor b_scale = scalar(1.0f / range_b);
    GemmParams host_params;
    host_params.trans_a = cs.trans_a;
    host_params.trans_b = cs.trans_b;
    host_params.alpha = cs.alpha;
    host_params.beta = cs.beta;
    host_params.fast_accumulate = cs.fast_accumulate;
    if (fp8) {
      host_params.a_scale = &a_scale;
      host_params.b_scale = &b_scale;
    }
    // An FP8 output is quantized with a scale that maps the largest value near 400 (found
    // with an F32 product first, as current scaling would), and its amax is checked too.
    Tensor c_scale = scalar(1.0f);
    Tensor host_amax = scalar(0.0f);
    if (fp8_out) {
      Tensor wide = host_tensor(c_shape, DType::kF32, c0);
      cpu_->gemm(a, b, wide, host_params);
      const std::vector<float> values = load(wide);
      float largest = 0.0f;
      for (float v : values) largest = std::max(largest, std::fabs(v));
      store(c_scale, {400.0f / largest});
      host_params.c_scale = &c_scale;
      host_params.c_amax = &host_amax;
    }

    Tensor want = host_tensor(c_shape, cs.c, c0);
    cpu_->gemm(a, b, want, host_params);

    const Tensor dev_a = to_device(*gpu_, a);
    const Tensor dev_b = to_device(*gpu_, b);
    Tensor dev_c = to_device(*gpu_, host_tensor(c_shape, cs.c, c0));
    const Tensor dev_a_scale = to_device(*gpu_, a_scale);
    const Tensor dev_b_scale = to_device(*gpu_, b_scale);
    const Tensor dev_c_scale = to_device(*gpu_, c_scale);
    Tensor dev_amax = to_device(*gpu_, scalar(-1.0f));
    GemmParams dev_params = host_params;
    if (fp8) {
      dev_params.a_scale = &dev_a_scale;
      dev_params.b_scale = &dev_b_scale;
    }
    if (fp8_out) {
      dev_params.c_scale = &dev_c_scale;
      dev_params.c_amax = &dev_amax;
    }
    gpu_->gemm(dev_a, dev_b, dev_c, dev_params);
    const Tensor got = to_host(*gpu_, dev_c);

    if (fp8_out) {
      const Fp8CodesApart apart = fp8_codes_apart(got, want);
      EXPECT_EQ(apart.beyond_one_step, 0);
      EXPECT_LE(apart.differ, want.numel() / 20) << "of " << want.numel() << " codes";
      const float got_amax = load(to_host(*gpu_, dev_amax))[0];
      const float want_amax = load(host_amax)[0];
      EXPECT_NEAR(got_amax, want_amax, 1e-2 * want_amax);
    } else {
      EXPECT_LE(max_relative_error(load(got), load(want)), cs.tolerance);
    }
  }

 private:
  std::unique_ptr<Backend> cpu_;
  std::unique_ptr<Backend> gpu_;
};

// Tolerance by the least precise dtype involved (see the top of this file).
double tolerance_for(DType in, DType out, bool fast_accumulate = false) {
  if (is_fp8(in) && fast_accumulate) return 6e-2;
  if (out == DType::kBF16) return 1e-2;
  if (is_fp8(in)) return 2e-3;
  if (out == DType::kF16) return 2e-3;
  return in == DType::kF32 ? 1e-5 : 1e-4;
}

constexpr bool kTransposes[4][2] = {{false, false}, {false, true}, {true, false}, {true, true}};

// ---------------------------------------------------------------------------------------
// Memory: copy, fill, allocator.

TEST(GpuMemory, CopyRoundTripsEveryDtype) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  auto gpu = make_cuda_backend(0);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2}) {
    SCOPED_TRACE(dtype_name(dtype));
    for (int64_t n : {0, 1, 7, 1000, 1 << 20}) {
      const Tensor host = host_tensor(Shape{n}, dtype, uniform(n, 100.0f, 7));
      const Tensor d1 = to_device(*gpu, host);
      Tensor d2 = Tensor::empty(host.shape(), dtype, gpu->device());
      gpu->copy(d1, d2);  // device to device
      const Tensor back = to_host(*gpu, d2);
      EXPECT_EQ(std::memcmp(back.data(), host.data(), host.nbytes()), 0) << "n = " << n;
    }
  }
}

TEST(GpuMemory, FillMatchesCpuBitForBit) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  auto cpu = make_cpu_backend();
  auto gpu = make_cuda_backend(0);
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2,
                      DType::kI32, DType::kI64, DType::kU8}) {
    for (float value : {0.0f, 1.0f, -3.3f, 1e-3f, 1000.0f, 1e6f, 7.9f}) {
      if ((dtype == DType::kU8 && value < 0.0f) || (dtype == DType::kU8 && value > 255.0f)) {
        continue;  // out of range for the conversion itself
      }
      SCOPED_TRACE(std::string(dtype_name(dtype)) + " " + std::to_string(value));
      Tensor want = Tensor::empty(Shape{1001}, dtype);
      cpu->fill(want, value);
      Tensor dev = Tensor::empty(Shape{1001}, dtype, gpu->device());
      gpu->fill(dev, value);
      const Tensor got = to_host(*gpu, dev);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.nbytes()), 0);
    }
  }
}

TEST(GpuMemory, CachingAllocatorReusesFreedBlocks) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  auto gpu = make_cuda_backend(0);
  void* first = nullptr;
  {
    Tensor t = Tensor::empty(Shape{12345}, DType::kF32, gpu->device());
    first = t.data();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(first) % 256, 0u);
  }
  // Same rounded size: the block just released comes back.
  Tensor again = Tensor::empty(Shape{12340}, DType::kF32, gpu->device());
  EXPECT_EQ(again.data(), first);
}

// Backend::host_syncs counts the host's waits: a warm GEMM (plan chosen, scratch grown) and
// uploads queue without waiting; a read is one copy and one synchronize().
TEST(GpuMemory, HostSyncsCountOnlyTheWaits) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  auto gpu = make_cuda_backend(0);
  const Tensor a =
      to_device(*gpu, host_tensor(Shape{64, 32}, DType::kBF16, std::vector<float>(64 * 32, 0.5f)));
  const Tensor b =
      to_device(*gpu, host_tensor(Shape{32, 48}, DType::kBF16, std::vector<float>(32 * 48, 0.25f)));
  Tensor c = Tensor::empty(Shape{64, 48}, DType::kF32, gpu->device());
  gpu->gemm(a, b, c, GemmParams{});
  gpu->synchronize();
  const int64_t before = gpu->host_syncs();
  for (int i = 0; i < 3; ++i) gpu->gemm(a, b, c, GemmParams{});
  EXPECT_EQ(gpu->host_syncs(), before) << "queued GEMMs must not wait for the GPU";
  const Tensor got = to_host(*gpu, c);
  EXPECT_EQ(gpu->host_syncs(), before + 1);
  EXPECT_EQ(load(got)[0], 32 * 0.5f * 0.25f);
}

TEST(GpuMemory, BadDeviceAndForeignTensorsAreErrors) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  EXPECT_THROW(make_cuda_backend(4096), Error);
  EXPECT_THROW(Tensor::empty(Shape{4}, DType::kF32, Device::cuda(4096)), Error);
  auto gpu = make_cuda_backend(0);
  Tensor host = Tensor::empty(Shape{4}, DType::kF32);
  Tensor dev = Tensor::empty(Shape{5}, DType::kF32, gpu->device());
  EXPECT_THROW(gpu->copy(host, dev), Error);   // element counts differ
  EXPECT_THROW(gpu->fill(host, 1.0f), Error);  // fill is for this device's tensors
}

// ---------------------------------------------------------------------------------------
// GEMM numerics against the CPU.

TEST(GpuGemm, F32AllTransposesAndOddSizes) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  GemmHarness h;
  const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {17, 31, 9}, {64, 64, 64}, {127, 129, 255}};
  for (const auto& [m, n, k] : sizes) {
    for (const auto& [ta, tb] : kTransposes) {
      GemmCase cs;
      cs.m = m, cs.n = n, cs.k = k, cs.trans_a = ta, cs.trans_b = tb;
      h.check(cs);
    }
  }
}

TEST(GpuGemm, Bf16AndF16AllTransposesAndOddSizes) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  GemmHarness h;
  const int64_t sizes[][3] = {{1, 1, 1}, {3, 5, 7}, {33, 17, 65}, {128, 96, 256}};
  const DType pairs[][2] = {{DType::kBF16, DType::kBF16},
                            {DType::kBF16, DType::kF32},
                            {DType::kF16, DType::kF32},
                            {DType::kF16, DType::kF16}};
  for (const auto& [in, out] : pairs) {
    for (const auto& [m, n, k] : sizes) {
      for (const auto& [ta, tb] : kTransposes) {
        GemmCase cs;
        cs.m = m, cs.n = n, cs.k = k, cs.trans_a = ta, cs.trans_b = tb;
        cs.a = cs.b = in;
        cs.c = out;
        cs.tolerance = tolerance_for(in, out);
        h.check(cs);
      }
    }
  }
}

// The products of one GPT-2 (124M) layer and the LM head, forward and backward, for 1024
// tokens: forward x W^T (W stored [out, in]), input gradient dy W, weight gradient dy^T x.
struct LinearShape {
  int64_t tokens, in, out;
};
constexpr LinearShape kGpt2Linears[] = {
    {1024, 768, 2304}, {1024, 768, 768}, {1024, 768, 3072}, {1024, 3072, 768}, {256, 768, 50304}};

// BF16 training, and FP16 training with its F16 activations.
TEST(GpuGemm, Bf16AndF16Gpt2Shapes) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  GemmHarness h;
  const DType pairs[][2] = {{DType::kBF16, DType::kBF16},
                            {DType::kBF16, DType::kF32},
                            {DType::kF16, DType::kF16},
                            {DType::kF16, DType::kF32}};
  for (const LinearShape& l : kGpt2Linears) {
    for (const auto& [in, out] : pairs) {
      GemmCase forward;
      forward.m = l.tokens, forward.n = l.out, forward.k = l.in, forward.trans_b = true;
      GemmCase input_grad;
      input_grad.m = l.tokens, input_grad.n = l.in, input_grad.k = l.out;
      GemmCase weight_grad;  // accumulates into the gradient buffer
      weight_grad.m = l.out, weight_grad.n = l.in, weight_grad.k = l.tokens;
      weight_grad.trans_a = true, weight_grad.beta = 1.0f;
      for (GemmCase cs : {forward, input_grad, weight_grad}) {
        cs.a = cs.b = in;
        cs.c = out;
        cs.tolerance = tolerance_for(in, out);
        h.check(cs);
      }
    }
  }
}

TEST(GpuGemm, AlphaBeta) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  GemmHarness h;
  const DType pairs[][2] = {{DType::kF32, DType::kF32},
                            {DType::kBF16, DType::kBF16},
                            {DType::kBF16, DType::kF32},
                            {DType::kF16, DType::kF16},
                            {DType::kF16, DType::kF32}};
  for (const auto& [in, out] : pairs) {
    for (const auto& [alpha, beta] : {std::pair{0.5f, 0.75f}, std::pair{-2.0f, 1.0f},
                                      std::pair{0.0f, 0.5f}, std::pair{1.0f, 0.0f}}) {
      GemmCase cs;
      cs.m = 48, cs.n = 40, cs.k = 72, cs.trans_b = true;
      cs.a = cs.b = in;
      cs.c = out;
      cs.alpha = alpha, cs.beta = beta;
      cs.nan_operands = alpha == 0.0f;
      cs.tolerance = tolerance_for(in, out);
      h.check(cs);
    }
  }
}

TEST(GpuGemm, EmptyInnerDimensionScalesC) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  GemmHarness h;
  for (DType out : {DType::kF32, DType::kBF16, DType::kF16}) {
    GemmCase cs;
    cs.m = 5, cs.n = 6, cs.k = 0;
    cs.a = cs.b = out;
    cs.c = out;
    cs.beta = 0.5f;
    h.check(cs);
  }
}

// Attention: scores = Q K^T and out = P V for batch * heads independent matrices.
TEST(GpuGemm, StridedBatched) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  GemmHarness h;
  for (DType in : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const auto& [ta, tb] : kTransposes) {
      GemmCase cs;
      cs.batch = 24, cs.m = 64, cs.n = 64, cs.k = 64, cs.trans_a = ta, cs.trans_b = tb;
      cs.a = cs.b = cs.c = in;
      cs.tolerance = tolerance_for(in, in);
      h.check(cs);
    }
    GemmCase odd;
    odd.batch = 5, odd.m = 7, odd.n = 9, odd.k = 11, odd.trans_b = true;
    odd.a = odd.b = odd.c = in;
    odd.tolerance = tolerance_for(in, in);
    h.check(odd);
  }
}

TEST(GpuGemm, Fp8PairsAllTransposes) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  GemmHarness h;
  if (!gpu_test::fp8_gemms_supported(h.gpu())) GTEST_SKIP() << gpu_test::kNoFp8TensorCores;
  const DType pairs[][2] = {
      {DType::kE4M3, DType::kE4M3}, {DType::kE4M3, DType::kE5M2}, {DType::kE5M2, DType::kE4M3}};
  for (const auto& [da, db] : pairs) {
    for (DType out : {DType::kF32, DType::kBF16}) {
      for (const auto& [ta, tb] : kTransposes) {
        for (bool fast : {false, true}) {
          GemmCase cs;
          cs.m = 80, cs.n = 48, cs.k = 96, cs.trans_a = ta, cs.trans_b = tb;
          cs.a = da, cs.b = db, cs.c = out;
          cs.fast_accumulate = fast;
          cs.tolerance = tolerance_for(da, out, fast);
          h.check(cs);
        }
      }
    }
  }
}

// FP8 training: forward E4M3 x E4M3 (TN, used in place), input gradient E5M2 x E4M3 (B
// copied transposed), weight gradient E5M2^T x E4M3 (A copied transposed, F32 accumulation).
TEST(GpuGemm, Fp8Gpt2Shapes) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  GemmHarness h;
  if (!gpu_test::fp8_gemms_supported(h.gpu())) GTEST_SKIP() << gpu_test::kNoFp8TensorCores;
  for (const LinearShape& l : kGpt2Linears) {
    GemmCase forward;
    forward.m = l.tokens, forward.n = l.out, forward.k = l.in, forward.trans_b = true;
    forward.a = forward.b = DType::kE4M3, forward.c = DType::kBF16;
    GemmCase input_grad;
    input_grad.m = l.tokens, input_grad.n = l.in, input_grad.k = l.out;
    input_grad.a = DType::kE5M2, input_grad.b = DType::kE4M3, input_grad.c = DType::kBF16;
    GemmCase weight_grad;
    weight_grad.m = l.out, weight_grad.n = l.in, weight_grad.k = l.tokens;
    weight_grad.trans_a = true, weight_grad.beta = 1.0f;
    weight_grad.a = DType::kE5M2, weight_grad.b = DType::kE4M3, weight_grad.c = DType::kF32;
    for (GemmCase cs : {forward, input_grad, weight_grad}) {
      cs.tolerance = tolerance_for(cs.a, cs.c, cs.fast_accumulate);
      h.check(cs);
    }
  }
}

TEST(GpuGemm, Fp8OutputWithScaleAndAmax) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  GemmHarness h;
  if (!gpu_test::fp8_gemms_supported(h.gpu())) GTEST_SKIP() << gpu_test::kNoFp8TensorCores;
  const DType combos[][3] = {{DType::kE4M3, DType::kE4M3, DType::kE4M3},
                             {DType::kE4M3, DType::kE5M2, DType::kE5M2},
                             {DType::kE5M2, DType::kE4M3, DType::kE4M3}};
  for (const auto& [da, db, out] : combos) {
    for (const auto& [ta, tb] : kTransposes) {
      GemmCase cs;
      cs.m = 64, cs.n = 96, cs.k = 128, cs.trans_a = ta, cs.trans_b = tb;
      cs.a = da, cs.b = db, cs.c = out;
      cs.alpha = 0.5f;
      h.check(cs);
    }
  }
  GemmCase batched;
  batched.batch = 6, batched.m = 32, batched.n = 48, batched.k = 64;
  batched.trans_a = true;  // both operands copied transposed, per batch
  batched.a = batched.b = batched.c = DType::kE4M3;
  h.check(batched);
}

// ---------------------------------------------------------------------------------------
// Errors: every bad call throws core::Error naming "gemm" and what is wrong.

void expect_gemm_error(Backend& gpu, const Tensor& a, const Tensor& b, Tensor& c,
                       const GemmParams& p, const std::string& fragment) {
  try {
    gpu.gemm(a, b, c, p);
    gpu.synchronize();
    ADD_FAILURE() << "no error; expected one mentioning \"" << fragment << "\"";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("gemm"), std::string::npos) << message;
    EXPECT_NE(message.find(fragment), std::string::npos) << message;
  }
}

TEST(GpuGemm, BadCallsAreErrors) {
  if (!mantissa::core::cuda_device_available()) GTEST_SKIP() << "skipped: no CUDA device";
  auto gpu = make_cuda_backend(0);
  const Device dev = gpu->device();
  const auto empty = [&](Shape s, DType d) { return Tensor::empty(s, d, dev); };
  GemmParams p;

  Tensor c = empty({8, 8}, DType::kF32);
  expect_gemm_error(*gpu, empty({8, 4}, DType::kF32), empty({5, 8}, DType::kF32), c, p,
                    "inner dimensions differ");
  expect_gemm_error(*gpu, empty({8, 4}, DType::kF32), empty({4, 8}, DType::kBF16), c, p,
                    "same dtype");
  Tensor host_c = Tensor::empty({8, 8}, DType::kF32);
  expect_gemm_error(*gpu, empty({8, 4}, DType::kF32), empty({4, 8}, DType::kF32), host_c, p,
                    "not on the backend's device");
  // Outputs outside the type table of gemm_checks.h.
  Tensor c_bf16 = empty({8, 8}, DType::kBF16);
  Tensor c_f16 = empty({8, 8}, DType::kF16);
  expect_gemm_error(*gpu, empty({8, 4}, DType::kF32), empty({4, 8}, DType::kF32), c_bf16, p,
                    "outputs for these operands: f32)");
  expect_gemm_error(*gpu, empty({8, 4}, DType::kF32), empty({4, 8}, DType::kF32), c_f16, p,
                    "outputs for these operands: f32)");
  expect_gemm_error(*gpu, empty({8, 4}, DType::kF16), empty({4, 8}, DType::kF16), c_bf16, p,
                    "outputs for these operands: f32, f16)");
  expect_gemm_error(*gpu, empty({8, 4}, DType::kBF16), empty({4, 8}, DType::kBF16), c_f16, p,
                    "outputs for these operands: f32, bf16)");
  Tensor scale = empty({1}, DType::kF32);
  GemmParams scaled;
  scaled.a_scale = &scale;
  expect_gemm_error(*gpu, empty({8, 4}, DType::kBF16), empty({4, 8}, DType::kBF16), c, scaled,
                    "applies to FP8 tensors only");

  if (!gpu_test::fp8_gemms_supported(*gpu)) return;
  GemmParams tn;  // the layout FP8 kernels take directly
  tn.trans_b = true;
  Tensor c16 = empty({16, 16}, DType::kF32);
  expect_gemm_error(*gpu, empty({16, 32}, DType::kE5M2), empty({16, 32}, DType::kE5M2), c16, tn,
                    "both E5M2");
  GemmParams accumulate = tn;
  accumulate.beta = 1.0f;
  Tensor c_e4m3 = empty({16, 16}, DType::kE4M3);
  expect_gemm_error(*gpu, empty({16, 32}, DType::kE4M3), empty({16, 32}, DType::kE4M3), c_e4m3,
                    accumulate, "beta must be 0");
  expect_gemm_error(*gpu, empty({16, 24}, DType::kE4M3), empty({16, 24}, DType::kE4M3), c16, tn,
                    "multiple of 16");
  Tensor c_narrow = empty({16, 20}, DType::kBF16);
  expect_gemm_error(*gpu, empty({16, 32}, DType::kE4M3), empty({20, 32}, DType::kE4M3), c_narrow,
                    tn, "multiple of 16 bytes");
  Tensor c_e5m2 = empty({16, 16}, DType::kE5M2);
  expect_gemm_error(*gpu, empty({16, 32}, DType::kE4M3), empty({16, 32}, DType::kE4M3), c_e5m2, tn,
                    "outputs for these operands: f32, bf16, e4m3)");
  Tensor c16_f16 = empty({16, 16}, DType::kF16);
  expect_gemm_error(*gpu, empty({16, 32}, DType::kE4M3), empty({16, 32}, DType::kE5M2), c16_f16, tn,
                    "outputs for these operands: f32, bf16, e4m3, e5m2)");
  // A view 8 bytes into a buffer, used in place (TN), is not 16-byte aligned.
  const Tensor buffer = empty({16 * 32 + 8}, DType::kE4M3);
  const Tensor shifted = buffer.view(8, Shape{16, 32});
  expect_gemm_error(*gpu, shifted, empty({16, 32}, DType::kE4M3), c16, tn, "16-byte aligned");
}

}  // namespace
}  // namespace mantissa::core
