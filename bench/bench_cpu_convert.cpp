// Throughput of the bulk CPU conversions (cpu_convert.h) next to memcpy.
//
// Each conversion moves n * (source size + destination size) bytes through memory. The
// anchor is a memcpy that moves the same number of bytes (it reads and writes half of them
// each), split over the same OpenMP threads. The two are timed in alternation and the medians
// compared, so load from other processes shifts both alike. Figures only: nothing here passes
// or fails.
//
// Usage: bench_cpu_convert [elements]   (default 2^24)
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_timing.h"
#include "core/dtype/dtype.h"
#include "core/ops/cpu/cpu_convert.h"
#include "core/ops/cpu_switches.h"
#include "core/tensor/tensor.h"

using namespace mantissa::core;

namespace {

using mantissa::bench::median;

constexpr int kRepeats = 15;

// memcpy split into one contiguous piece per OpenMP thread.
void parallel_memcpy(char* dst, const char* src, size_t bytes) {
#pragma omp parallel
  {
    const size_t threads = static_cast<size_t>(omp_get_num_threads());
    const size_t t = static_cast<size_t>(omp_get_thread_num());
    const size_t piece = (bytes / threads + 63) / 64 * 64;
    const size_t begin = std::min(bytes, t * piece);
    const size_t end = std::min(bytes, begin + piece);
    std::memcpy(dst + begin, src + begin, end - begin);
  }
}

struct Timing {
  double op_seconds;
  double memcpy_seconds;
};

// Median times of `op` and of a memcpy moving the same number of bytes, run in alternation.
template <class Op>
Timing time_against_memcpy(size_t bytes_moved, const Op& op) {
  static std::vector<char> from, to;
  const size_t copy_bytes = bytes_moved / 2;
  if (from.size() < copy_bytes) {
    from.assign(copy_bytes, 1);
    to.assign(copy_bytes, 0);
  }
  op();  // warm up: page faults, thread start
  parallel_memcpy(to.data(), from.data(), copy_bytes);
  std::vector<double> op_times, copy_times;
  for (int r = 0; r < kRepeats; ++r) {
    auto start = std::chrono::steady_clock::now();
    op();
    op_times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    start = std::chrono::steady_clock::now();
    parallel_memcpy(to.data(), from.data(), copy_bytes);
    copy_times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return {median(op_times), median(copy_times)};
}

void report(const std::string& name, size_t bytes_moved, const Timing& t) {
  const double op_gbs = static_cast<double>(bytes_moved) / t.op_seconds / 1e9;
  const double copy_gbs = static_cast<double>(bytes_moved) / t.memcpy_seconds / 1e9;
  std::printf("%-34s %9.2f %9.2f %9.2f %7.2f\n", name.c_str(), t.op_seconds * 1e3, op_gbs, copy_gbs,
              op_gbs / copy_gbs);
}

}  // namespace

static int benchmark_main(int argc, char** argv) {
  const mantissa::bench::Arguments args(argc, argv, "bench_cpu_convert [elements >= 1]");
  args.expect_at_most(1);
  const int64_t n = args.whole<int64_t>(1, int64_t{1} << 24, 1);
  std::printf("bench_cpu_convert: %lld elements, %d OpenMP threads\n", static_cast<long long>(n),
              omp_get_max_threads());
  std::printf("%s\n", mantissa::core::cpu_paths_description().c_str());
  std::printf("GB/s = bytes read + written per second; memcpy moves the same bytes\n\n");
  std::printf("%-34s %9s %9s %9s %7s\n", "conversion", "ms", "GB/s", "memcpy", "ratio");

  // Activations-like data: mostly in [-4, 4] with a tail, a scale that maps its amax near
  // E4M3's 448 for the quantize case.
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> f32(static_cast<size_t>(n));
  for (float& x : f32) x = normal(rng);
  std::vector<float> widened(static_cast<size_t>(n));
  std::vector<unsigned char> narrow_buffer(static_cast<size_t>(n) * 2);

  const DType dtypes[] = {DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2};
  for (DType dtype : dtypes) {
    const size_t bytes = static_cast<size_t>(n) * (4 + dtype_size(dtype));
    const std::string name = dtype_name(dtype);

    NarrowOptions nearest;
    report("narrow f32 -> " + name, bytes, time_against_memcpy(bytes, [&] {
             narrow_from_f32(f32.data(), narrow_buffer.data(), dtype, n, nearest);
           }));
    report("widen " + name + " -> f32", bytes, time_against_memcpy(bytes, [&] {
             widen_to_f32(narrow_buffer.data(), dtype, widened.data(), n);
           }));
    NarrowOptions stochastic;
    stochastic.stochastic = true;
    stochastic.seed = 42;
    report("narrow f32 -> " + name + " stochastic", bytes, time_against_memcpy(bytes, [&] {
             narrow_from_f32(f32.data(), narrow_buffer.data(), dtype, n, stochastic);
           }));
  }

  // The FP8 quantize of a cast: scale, round to E4M3 (satfinite), amax of the input fused.
  NarrowOptions quantize;
  quantize.scale = 448.0f / 6.0f;
  quantize.want_amax = true;
  const size_t bytes = static_cast<size_t>(n) * 5;
  report("quantize f32 -> e4m3 + amax", bytes, time_against_memcpy(bytes, [&] {
           narrow_from_f32(f32.data(), narrow_buffer.data(), DType::kE4M3, n, quantize);
         }));
  // The cast of an FP8 step: a BF16 activation or weight copy quantised in one pass.
  std::vector<bf16> activations(static_cast<size_t>(n));
  for (size_t i = 0; i < activations.size(); ++i) activations[i] = bf16_from_float(f32[i]);
  report("quantize bf16 -> e4m3 + amax", static_cast<size_t>(n) * 3,
         time_against_memcpy(static_cast<size_t>(n) * 3, [&] {
           narrow_from_16bit(activations.data(), DType::kBF16, narrow_buffer.data(), DType::kE4M3,
                             n, quantize);
         }));
  // The same with stochastic rounding. Scaled, few values land among E4M3's subnormals (below
  // 2^-6), whose lanes cost extra; the unscaled "stochastic" rows above have many.
  NarrowOptions stochastic_quantize = quantize;
  stochastic_quantize.stochastic = true;
  stochastic_quantize.seed = 42;
  report("quantize f32 -> e4m3 + amax, stoch.", bytes, time_against_memcpy(bytes, [&] {
           narrow_from_f32(f32.data(), narrow_buffer.data(), DType::kE4M3, n, stochastic_quantize);
         }));
  report("widen e4m3 -> f32 with scale", bytes, time_against_memcpy(bytes, [&] {
           widen_to_f32(narrow_buffer.data(), DType::kE4M3, widened.data(), n, 6.0f / 448.0f);
         }));
  return 0;
}

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_cpu_convert",
                                         [&] { return benchmark_main(argc, argv); });
}
