// What every benchmark times with: the median of repeated timings (robust to the outliers of a
// noisy machine), and one timed call on the host's steady clock.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace mantissa::bench {

// The middle of `values` (the upper one of the two middles for an even count).
inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Seconds one call of `op` takes.
template <class Op>
double seconds_of(const Op& op) {
  const auto start = std::chrono::steady_clock::now();
  op();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace mantissa::bench
