#include "train/fault_injection.h"

#include <algorithm>
#include <cmath>

namespace mantissa::train {

std::function<void(core::Tensor&, int64_t)> nonfinite_injector(core::Backend& backend, int rank,
                                                               int inject_rank,
                                                               std::vector<int64_t> steps) {
  if (rank != inject_rank || steps.empty()) return {};
  return [&backend, steps = std::move(steps)](core::Tensor& grads, int64_t step) {
    if (grads.numel() == 0 || std::find(steps.begin(), steps.end(), step) == steps.end()) return;
    core::Tensor first = grads.view(0, core::Shape{1});
    backend.fill(first, INFINITY);  // works on host and device memory alike
  };
}

}  // namespace mantissa::train
