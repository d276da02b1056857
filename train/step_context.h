// What every layer needs during a forward/backward pass.
#pragma once

#include <cstdint>
#include <functional>

#include "core/ops/backend.h"
#include "core/precision/policy.h"

namespace mantissa::train {

class Fp8Operands;

struct StepContext {
  core::Backend& backend;
  core::PrecisionPolicy policy;
  Fp8Operands* fp8 = nullptr;  // set when policy.fp8_block_gemms
  // Called with a parameter's index once its gradient for this step is final, so that
  // gradient synchronisation can start on it while the rest of backward runs. Empty when
  // nobody listens (single rank, or a micro-step that is not the last of an accumulation).
  std::function<void(int)> grad_ready;
  // The training step this pass belongs to, or -1 outside training steps (evaluation, tests).
  // Within one step the weights do not change, so what a layer derives from them (the FP8
  // copies of the block recipes) is made once per step and reused by every micro-batch.
  int64_t step = -1;

  void mark_grad_ready(int param) const {
    if (grad_ready) grad_ready(param);
  }
};

}  // namespace mantissa::train
