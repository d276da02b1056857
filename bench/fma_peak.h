// The FP32 fused multiply-add peak of this machine, measured in the benchmark's own run (not
// taken from a data sheet), on the OpenMP threads the CPU backend uses.
//
// Every thread runs 12 independent chains of vector FMAs. Current x86 cores retire two FMAs
// per cycle with a latency of 4 or 5 cycles, so 8-10 chains in flight keep both ports busy;
// 12 leave room. The chains live in registers (no loads or stores in the loop), so the loop
// runs at the FMA ports' throughput. Where the CPU has AVX-512 the 16-lane FMA is measured as
// well, and it is the peak where it is clearly faster: on some cores (Intel's server parts) it
// doubles the 8-lane figure, on others (AMD Zen 4) it runs as two 8-lane halves and does not. The
// best of several repetitions is kept: a peak is the most the machine gives.
//
// With MANTISSA_CPU_AVX512_CONVERT=0 (the README's way to see on an AVX-512 machine what an
// AVX2-only CPU gets) only the 8-lane FMA is measured: the peak is then that of the CPU the run
// stands in for, whose figures the fractions are to be read against.
#pragma once

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <string>

#include "core/ops/cpu/cpu_switch.h"

namespace mantissa::bench {

struct FmaPeak {
  double gflops = 0;  // 2 flops per FMA lane, all threads together
  int lanes = 0;      // FP32 lanes of the FMA that reached it (8: AVX2, 16: AVX-512)
  int threads = 0;
  bool avx512_switched_off = false;
  std::string describe() const {
    return std::to_string(lanes * 32) + "-bit FMA, " + std::to_string(threads) + " threads" +
           (avx512_switched_off ? ", AVX-512 switched off" : "");
  }
};

namespace fma_peak_detail {

constexpr int kChains = 12;

// FMAs per thread: `iterations` of kChains vectors of 8 lanes. Returns a sum of the chains,
// which the caller keeps, so that no chain can be optimized away.
[[gnu::target("avx2,fma")]] inline float run8(long iterations, float a, float b) {
  __m256 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm256_set1_ps(static_cast<float>(i));
  const __m256 va = _mm256_set1_ps(a), vb = _mm256_set1_ps(b);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm256_fmadd_ps(acc[i], va, vb);
  }
  __m256 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm256_add_ps(sum, acc[i]);
  return _mm256_cvtss_f32(sum);
}

[[gnu::target("avx512f")]] inline float run16(long iterations, float a, float b) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(static_cast<float>(i));
  const __m512 va = _mm512_set1_ps(a), vb = _mm512_set1_ps(b);
  for (long it = 0; it < iterations; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], va, vb);
  }
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  return _mm512_cvtss_f32(sum);
}

// GFLOP/s of `lanes`-wide FMAs on every OpenMP thread, in one timed run of `iterations` loop
// trips.
inline double measure_once(int lanes, long iterations) {
  // Runtime values, so the compiler cannot fold the chains; x -> 0.999 x + 1e-3 stays finite.
  volatile float a = 0.999f, b = 1e-3f;
  [[maybe_unused]] volatile float sink = 0;  // where the chains' sums go
  const float x = a, y = b;
  float total = 0;
  const double start = omp_get_wtime();
#pragma omp parallel reduction(+ : total)
  total += lanes == 16 ? run16(iterations, x, y) : run8(iterations, x, y);
  sink = total;
  const double seconds = omp_get_wtime() - start;
  return 2.0 * lanes * kChains * static_cast<double>(iterations) * omp_get_max_threads() / seconds *
         1e-9;
}

}  // namespace fma_peak_detail

// About 0.1 s per width: the best of 8 runs of 2^22 trips (12 FMAs each, a few ms per run on a
// 3 GHz core), the two widths alternating so that a burst of load from another process does
// not fall on one of them only.
inline FmaPeak measure_fma_peak() {
  constexpr long kIterations = 1L << 22;
  constexpr int kRepetitions = 8;
  // The switch is read on every CPU, so that a malformed value is refused everywhere, not only
  // where AVX-512 exists.
  const bool switched_on = core::env_switch_on(core::kAvx512ConvertSwitch);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool wide = avx512 && switched_on;
  double best8 = 0, best16 = 0;
  for (int r = 0; r < kRepetitions; ++r) {
    best8 = std::max(best8, fma_peak_detail::measure_once(8, kIterations));
    if (wide) best16 = std::max(best16, fma_peak_detail::measure_once(16, kIterations));
  }
  FmaPeak peak;
  peak.threads = omp_get_max_threads();
  peak.avx512_switched_off = avx512 && !wide;
  // Only a clearly faster 16-lane FMA counts: where both run at the same rate, noise alone
  // would otherwise pick either.
  peak.lanes = best16 > 1.25 * best8 ? 16 : 8;
  peak.gflops = peak.lanes == 16 ? best16 : best8;
  return peak;
}

}  // namespace mantissa::bench
