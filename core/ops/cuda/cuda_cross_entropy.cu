// The fused softmax cross-entropy on the GPU: the per-element pieces are
// core/ops/math/softmax.h's, the CPU backend's (cpu_cross_entropy.cpp); FP32 internally, one
// rounding to nearest even per stored value. Operands are read and written as
// cuda_layer_io.cuh describes.
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/math/softmax.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

// One block per row of logits[N, V], over its first valid_cols columns (the vocabulary):
//   loss = logsumexp(z) - z[target] = max + log(sum exp(z - max)) - z[target]
//   dz   = (softmax(z) - onehot(target)) * grad_scale
// and dz = 0 for the padding columns past them, which are never read. Thread i takes columns
// i, i + blockDim, ... below valid_cols, the same as for a row with no padding, so the block
// reductions add the same partial sums in the same order: the result is bit-identical to the
// kernel on an unpadded copy of the logits.
// Every read of the row (z[target] included) happens before the block reductions' barriers
// and every write after them, each element written by the thread that read it, which is what
// lets dlogits alias logits.
// A target outside [0, valid_cols) is not checked here (reading the targets back would
// synchronise the host at every call): its row's loss and every dz of the row are NaN, which
// the training step's non-finite check catches. The data loaders check every target on the
// host (train/data/corpus.h).
constexpr int kCrossEntropyBlock = 512;

__global__ void softmax_cross_entropy_kernel(FloatIn logits, const int32_t* __restrict__ targets,
                                             float* __restrict__ losses, FloatOut dlogits,
                                             float grad_scale, int64_t V, int64_t valid_cols) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * V;
  const int32_t target = targets[blockIdx.x];
  const bool valid_target = target >= 0 && target < valid_cols;
  const float z_target = valid_target ? load(logits, base + target) : NAN;

  // A NaN logit never wins the comparison but makes the sum, hence the loss, NaN.
  float max_logit = -INFINITY;
  for (int64_t v = threadIdx.x; v < valid_cols; v += blockDim.x) {
    const float z = load(logits, base + v);
    max_logit = softmax_max(max_logit, z);
  }
  max_logit = block_max(max_logit);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < valid_cols; v += blockDim.x)
    sum += softmax_exp(load(logits, base + v), max_logit);
  sum = block_sum(sum);
  if (threadIdx.x == 0) losses[blockIdx.x] = cross_entropy_loss(max_logit, sum, z_target);

  if (dlogits.data == nullptr) return;
  const float inv_sum = 1.0f / sum;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float dz = 0.0f;  // a padding column
    if (v < valid_cols) {
      const float p = softmax_exp(load(logits, base + v), max_logit) * inv_sum;
      dz = valid_target ? cross_entropy_grad(p, v == target, grad_scale) : NAN;
    }
    store(dlogits, base + v, dz);
  }
}

}  // namespace

void CudaBackend::softmax_cross_entropy(const Tensor& logits, int64_t valid_cols,
                                        const Tensor& targets, Tensor& losses, Tensor* dlogits,
                                        float grad_scale) {
  const auto [N, V] =
      check_softmax_cross_entropy(logits, valid_cols, targets, losses, dlogits, device());
  if (N == 0) return;

  const FloatOut grad = dlogits != nullptr ? as_out(*dlogits) : FloatOut{nullptr, DType::kF32};
  softmax_cross_entropy_kernel<<<static_cast<unsigned>(N), kCrossEntropyBlock, 0, stream_>>>(
      as_in(logits), targets.data_as<const int32_t>(), losses.data_as<float>(), grad, grad_scale, V,
      valid_cols);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
