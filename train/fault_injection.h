// Fault injection for tests and drills (config: debug.inject_nonfinite_rank and
// debug.inject_nonfinite_steps).
//
//   step.before_check = train::nonfinite_injector(backend, world.rank(),
//                                                   cfg.inject_nonfinite_rank,
//                                                   {steps...});
//
// On rank `inject_rank` only, at each listed step, +inf is written into the first element of
// the gradients TrainingStep hands to before_check (this rank's owned, already averaged
// range). Nothing else sees the inf: the step must be skipped on every rank only because the
// non-finite flag is MAX-reduced, which is what the injection exercises.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "core/ops/backend.h"
#include "core/tensor/tensor.h"

namespace mantissa::train {

std::function<void(core::Tensor& grads, int64_t step)> nonfinite_injector(
    core::Backend& backend, int rank, int inject_rank, std::vector<int64_t> steps);

}  // namespace mantissa::train
