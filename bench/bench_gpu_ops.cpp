// Memory bandwidth of the CUDA backend's memory-bound kernels, next to the device-to-device
// copy bandwidth measured in the same run (Backend::copy between two device tensors, which
// is one cudaMemcpyAsync). For each op it prints the bytes one call must move (every operand
// read or written once), the time per call, the resulting GB/s and the fraction of the copy
// bandwidth; 70% or more is the goal for these kernels, the FP8 block recipes' quantisation
// and the gradient sync's pack and unpack casts among them (the last two sections). Figures only:
// nothing here passes or fails on time.
//
//   bench_gpu_ops [elements]     (default 2^26; every operand is that long)
//
// Without a CUDA device it prints "no CUDA device" and exits 0.
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "core/ops/backend.h"
#include "core/precision/block_scaling.h"

namespace mantissa::core {
namespace {

constexpr int kRepeats = 20;

// Seconds per call of `op`: one untimed call (first-touch and caches), then kRepeats calls
// queued back to back between two synchronisations.
double seconds_per_call(Backend& backend, const std::function<void()>& op) {
  op();
  backend.synchronize();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kRepeats; ++i) op();
  backend.synchronize();
  const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
  return elapsed.count() / kRepeats;
}

void report(const char* name, double bytes, double seconds, double copy_gbps) {
  const double gbps = bytes / seconds / 1e9;
  std::printf("%-34s %10.1f MB %10.1f us %9.1f GB/s %7.1f%% of copy\n", name, bytes / 1e6,
              seconds * 1e6, gbps, 100.0 * gbps / copy_gbps);
}

// Block quantisation (the FP8 block recipes) of a BF16 activation x [tokens, C] to E4M3 with
// its scales, as the Linear layer quantises its operands: x as the forward's input (1x128 and
// per-row), as the weight gradient's (regrouped along the tokens: transposed), and in 128x128
// blocks as a weight.
void block_quantize_kernels(Backend& be, const Tensor& x, double copy_gbps) {
  std::printf("block quantisation of bf16 [%lld, %lld] to e4m3 with scales:\n",
              static_cast<long long>(x.dim(0)), static_cast<long long>(x.dim(1)));
  struct Case {
    const char* name;
    ScaleMode mode;
    bool transpose;
  };
  const Case cases[] = {{"  1x128", ScaleMode::kVec128, false},
                        {"  1x128 along tokens (transposed)", ScaleMode::kVec128, true},
                        {"  128x128", ScaleMode::kBlock128, false},
                        {"  per row", ScaleMode::kOuterVec, false},
                        {"  per row along tokens (transposed)", ScaleMode::kOuterVec, true}};
  for (const Case& c : cases) {
    const int64_t outer = x.dim(c.transpose ? 1 : 0), k = x.dim(c.transpose ? 0 : 1);
    Tensor codes = Tensor::empty(Shape{outer, k}, DType::kE4M3, be.device());
    Tensor scales =
        Tensor::empty(Shape{scale_count(c.mode, outer, k)}, scale_dtype(c.mode), be.device());
    BlockQuantizeParams p;
    p.mode = c.mode;
    p.transpose = c.transpose;
    const double bytes = static_cast<double>(x.nbytes() + codes.nbytes() + scales.nbytes());
    report(c.name, bytes, seconds_per_call(be, [&] { be.quantize_blocks(x, codes, scales, p); }),
           copy_gbps);
  }
}

// What DataParallel runs on the device around every gradient bucket's collective
// (dist/bucketed_grad_sync.cpp): the pack, which casts the FP32 gradients to the reduce dtype with
// the pre-division q fused in (and, for BF16/FP16, the amax that is also the non-finite
// check), and the unpack, which widens the reduced codes back to FP32 with the scale w. FP8
// buckets take their amax in a separate pass first (for the shared scale), and FP32 buckets
// are pre-divided in place by unscale_check_finite (above).
void grad_sync_kernels(Backend& be, int64_t n, double copy_gbps) {
  const Device dev = be.device();
  Tensor grads = Tensor::empty(Shape{n}, DType::kF32, dev);
  be.fill(grads, 0.375f);
  Tensor q = Tensor::empty(Shape{1}, DType::kF32, dev);
  Tensor w = Tensor::empty(Shape{1}, DType::kF32, dev);
  Tensor amax = Tensor::empty(Shape{1}, DType::kF32, dev);
  be.fill(q, 0.125f);
  be.fill(w, 8.0f);
  const double f32 = 4.0 * static_cast<double>(n);
  std::printf("gradient sync (pack before the collective, unpack after):\n");
  be.amax(grads, amax);
  report("  amax f32 (FP8 bucket scale)", f32, seconds_per_call(be, [&] { be.amax(grads, amax); }),
         copy_gbps);
  for (const DType dtype : {DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2}) {
    Tensor low = Tensor::empty(Shape{n}, dtype, dev);
    const double low_bytes = static_cast<double>(dtype_size(dtype)) * static_cast<double>(n);
    CastParams pack;
    pack.scale = &q;
    if (!is_fp8(dtype)) pack.amax = &amax;
    CastParams unpack;
    unpack.scale = &w;
    const std::string name = dtype_name(dtype);
    report(("  pack f32 -> " + name + (is_fp8(dtype) ? ", scale" : ", scale + amax")).c_str(),
           f32 + low_bytes, seconds_per_call(be, [&] { be.cast(grads, low, pack); }), copy_gbps);
    report(("  unpack " + name + " -> f32, scale").c_str(), low_bytes + f32,
           seconds_per_call(be, [&] { be.cast(low, grads, unpack); }), copy_gbps);
  }
}

int run(int64_t n) {
  auto backend = make_cuda_backend(0);
  Backend& be = *backend;
  const Device dev = be.device();
  auto tensor = [&](DType dtype, float value, const Shape& shape) {
    Tensor t = Tensor::empty(shape, dtype, dev);
    be.fill(t, value);
    return t;
  };
  const double f32 = 4.0 * static_cast<double>(n);
  const double half = 2.0 * static_cast<double>(n);
  const double byte = static_cast<double>(n);

  Tensor a32 = tensor(DType::kF32, 0.75f, Shape{n});
  Tensor b32 = tensor(DType::kF32, 0.0f, Shape{n});
  const double copy_seconds = seconds_per_call(be, [&] { be.copy(a32, b32); });
  const double copy_gbps = 2.0 * f32 / copy_seconds / 1e9;
  std::printf("%lld elements per operand, %d calls per figure\n", static_cast<long long>(n),
              kRepeats);
  report("copy f32 (cudaMemcpyAsync D2D)", 2.0 * f32, copy_seconds, copy_gbps);

  Tensor a16 = tensor(DType::kBF16, 0.5f, Shape{n});
  Tensor b16 = tensor(DType::kBF16, -0.25f, Shape{n});
  Tensor c16 = tensor(DType::kBF16, 0.0f, Shape{n});
  Tensor e4m3 = tensor(DType::kE4M3, 0.0f, Shape{n});
  Tensor scale = tensor(DType::kF32, 2.0f, Shape{1});
  Tensor amax = tensor(DType::kF32, 0.0f, Shape{1});

  report("cast f32 -> bf16", f32 + half,
         seconds_per_call(be, [&] { be.cast(a32, c16, CastParams{}); }), copy_gbps);
  CastParams fp8;
  fp8.scale = &scale;
  fp8.amax = &amax;
  report("cast f32 -> e4m3, scale + amax", f32 + byte,
         seconds_per_call(be, [&] { be.cast(a32, e4m3, fp8); }), copy_gbps);
  report("add bf16", 3.0 * half, seconds_per_call(be, [&] { be.add(a16, b16, c16); }), copy_gbps);
  report("gelu_forward bf16", 2.0 * half, seconds_per_call(be, [&] { be.gelu_forward(a16, c16); }),
         copy_gbps);
  report("gelu_backward bf16", 3.0 * half,
         seconds_per_call(be, [&] { be.gelu_backward(a16, b16, c16); }), copy_gbps);

  // LayerNorm over GPT-2 small rows (C = 768); the per-row mean and rstd are negligible.
  const int64_t C = 768;
  const int64_t rows = n / C;
  Tensor x = a16.view(0, Shape{rows, C});
  Tensor y = c16.view(0, Shape{rows, C});
  const Tensor gamma = tensor(DType::kF32, 1.0f, Shape{C});
  const Tensor beta = tensor(DType::kF32, 0.0f, Shape{C});
  Tensor mean = tensor(DType::kF32, 0.0f, Shape{rows});
  Tensor rstd = tensor(DType::kF32, 0.0f, Shape{rows});
  report("layernorm_forward bf16, C = 768", 2.0 * 2.0 * static_cast<double>(rows * C),
         seconds_per_call(be, [&] { be.layernorm_forward(x, gamma, beta, y, mean, rstd); }),
         copy_gbps);

  // AdamW: params, m, v read and written (F32), BF16 grads read, BF16 compute copy written.
  Tensor m = tensor(DType::kF32, 0.01f, Shape{n});
  Tensor v = tensor(DType::kF32, 1e-4f, Shape{n});
  AdamWParams p;
  p.lr = 1e-4f;
  p.weight_decay = 0.1f;
  const std::vector<ParamRange> whole = {{0, n, true}};
  report("adamw f32, bf16 grads + copy", 6.0 * f32 + 2.0 * half,
         seconds_per_call(be, [&] { be.adamw(a32, b16, m, v, &c16, whole, p); }), copy_gbps);

  // The consistency check's checksum of the masters: one read.
  Tensor sum = Tensor::empty(Shape{1}, DType::kI64, dev);
  report("checksum f32", f32, seconds_per_call(be, [&] { be.checksum(a32, sum); }), copy_gbps);

  Tensor found = tensor(DType::kF32, 0.0f, Shape{1});
  Tensor first = tensor(DType::kI64, 0.0f, Shape{1});
  report("unscale_check_finite f32", 2.0 * f32,
         seconds_per_call(be, [&] { be.unscale_check_finite(b32, 1.0f, found, &first); }),
         copy_gbps);

  block_quantize_kernels(be, x, copy_gbps);
  grad_sync_kernels(be, n, copy_gbps);
  return 0;
}

}  // namespace
}  // namespace mantissa::core

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_gpu_ops", [&] {
    const mantissa::bench::Arguments args(argc, argv, "bench_gpu_ops [elements >= 768]");
    args.expect_at_most(1);
    const int64_t n = args.whole<int64_t>(1, int64_t{1} << 26, 768);  // one LayerNorm row
    if (!mantissa::core::cuda_device_available()) {
      std::printf("no CUDA device\n");
      return 0;
    }
    return mantissa::core::run(n);
  });
}
