// Prints the "CPU paths" line the CPU benchmarks start with (bench/cpu_paths.h), for benchmark
// scripts whose other programs do not print it (the PyTorch anchor, bench_dist_train).
//
//   bench_cpu_paths
#include <cstdio>

#include "bench/cpu_paths.h"

int main() {
  std::printf("%s\n", mantissa::bench::cpu_paths_description().c_str());
  return 0;
}
