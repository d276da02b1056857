// The fused softmax cross-entropy on the CPU (the math follows llm.c's train_gpt2.c; the
// per-element pieces are core/ops/math/softmax.h's, shared with the CUDA backend). Operands
// are read and written as cpu_layer_io.h describes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_layer_io.h"
#include "core/ops/cpu/cpu_softmax_rows.h"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {

using namespace cpu_layer_io;

// One row of logits per iteration, over its first valid_cols columns (the vocabulary):
//   loss = logsumexp(z) - z[target] = (max - z[target]) + log(sum exp(z - max))
//   dz   = (softmax(z) - onehot(target)) * grad_scale
// and dz = 0 for the padding columns past them, whatever they hold (they are never read, so
// not even a NaN there reaches the loss). Each loop runs over the first valid_cols columns in
// order, exactly as over a row that had no others, which is what makes the result
// bit-identical to the op on an unpadded copy of the logits.
// The row is widened into scratch before anything is written, which is what lets dlogits
// alias logits.
void CpuBackend::softmax_cross_entropy(const Tensor& logits, int64_t valid_cols,
                                       const Tensor& targets, Tensor& losses, Tensor* dlogits,
                                       float grad_scale) {
  const auto [N, V] =
      check_softmax_cross_entropy(logits, valid_cols, targets, losses, dlogits, device());
  check_indices("softmax_cross_entropy", "target", targets, valid_cols);

  const int32_t* target = targets.data_as<const int32_t>();
  float* loss = losses.data_as<float>();
#pragma omp parallel
  {
    std::vector<float> row(static_cast<size_t>(V));
    float* z = row.data();
#pragma omp for schedule(static)
    for (int64_t n = 0; n < N; ++n) {
      load(logits, n * V, valid_cols, z);
      const int64_t y = target[n];
      const float z_target = z[y];
      // A NaN logit never wins the comparison but makes the sum, hence the loss, NaN.
      const float max_logit = softmax_row_max(z, valid_cols);
      softmax_exp_row(z, valid_cols, max_logit);
      const float sum = softmax_row_sum(z, valid_cols);
      loss[n] = cross_entropy_loss(max_logit, sum, z_target);
      if (dlogits != nullptr) {
        // The probabilities first, each rounded to FP32, then the gradient from them (the
        // target's 1 comes off the rounded probability).
        const float inv_sum = 1.0f / sum;
        for (int64_t v = 0; v < valid_cols; ++v) z[v] *= inv_sum;
        for (int64_t v = 0; v < valid_cols; ++v)
          z[v] = cross_entropy_grad(z[v], v == y, grad_scale);
        std::fill(z + valid_cols, z + V, 0.0f);
        store(z, V, *dlogits, n * V);
      }
    }
  }
}

}  // namespace mantissa::core
