// Prints the "CPU paths" line the CPU benchmarks start with (core::cpu_paths_description), for
// benchmark scripts whose other programs do not print it (the PyTorch anchor, bench_dist_train).
//
//   bench_cpu_paths
#include <cstdio>

#include "bench/bench_main.h"
#include "core/ops/cpu_switches.h"

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_cpu_paths", [&] {
    mantissa::bench::Arguments(argc, argv, "bench_cpu_paths").expect_at_most(0);
    std::printf("%s\n", mantissa::core::cpu_paths_description().c_str());
    return 0;
  });
}
