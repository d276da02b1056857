// The FP32 FMA peak of this machine on OMP_NUM_THREADS threads (bench/fma_peak.h), for scripts:
// bench/bench_scaling.sh gives it to `mantissa plan --gpu cpu --tflops` as one rank's peak.
//
//   OMP_NUM_THREADS=1 fma_peak   ->   fma_peak_gflops=113.5 lanes=8 threads=1
#include "bench/fma_peak.h"

#include <cstdio>

#include "bench/bench_main.h"

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("fma_peak", [&] {
    mantissa::bench::Arguments(argc, argv, "fma_peak").expect_at_most(0);
    const mantissa::bench::FmaPeak peak = mantissa::bench::measure_fma_peak();
    std::printf("fma_peak_gflops=%.1f lanes=%d threads=%d\n", peak.gflops, peak.lanes,
                peak.threads);
    return 0;
  });
}
