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
//   loss = logsumexp(z) - z[target] = (max - z[target]) + log(sum exp(z - max))
//   dz   = (softmax(z) - onehot(target)) * grad_scale
// and dz = 0 for the padding columns past them, which are never read. Thread i takes columns
// i, i + blockDim, ... below valid_cols, the same as for a row with no padding, so the block
// reductions add the same partial sums in the same order: the result is bit-identical to the
// kernel on an unpadded copy of the logits.
// The row is needed three times (maximum, sum, gradient). Read from DRAM each time, that is
// three reads of the largest tensor of the step (GPT-2: 16K rows of 50304 FP32 logits, 3.3 GB)
// where one suffices: with 16K rows in flight no row stays in L2 between passes. So where the
// row fits in shared memory as FP32 (200 KB for 50257 columns: sm_90's 227 KB per block, not
// sm_80's 163 KB), a first pass copies it there with 16-byte loads and the three passes read
// it from there (StagedRow); elsewhere they read the logits again (GlobalRow). Both do the
// same arithmetic on the same values.
// Every read of the logits (z[target] included) happens before the block reductions'
// barriers and every write after them, each element written by the thread that read it (or,
// staged, by a thread of the block after the copy), which is what lets dlogits alias logits.
// A target outside [0, valid_cols) is not checked here (reading the targets back would
// synchronise the host at every call): its row's loss and every dz of the row are NaN, which
// the training step's non-finite check catches. The data loaders check every target on the
// host (train/data/corpus.h).
constexpr int kCrossEntropyBlock = 1024;

// A row's values z(v) and its terms exp(z(v) - max), which the sum pass computes and the
// gradient pass needs again: GlobalRow computes them twice; StagedRow keeps each in place of
// its z (the thread that computes it is the one that reads it back), so the gradient pass
// reads the very same value instead of paying for a second exp.
struct GlobalRow {
  FloatIn logits;
  int64_t base;
  __device__ __forceinline__ float operator()(int64_t v) const { return load(logits, base + v); }
  __device__ __forceinline__ void keep_term(int64_t, float) const {}
  __device__ __forceinline__ float term(int64_t v, float max_logit) const {
    return softmax_exp((*this)(v), max_logit);
  }
};

struct StagedRow {
  float* row;
  __device__ __forceinline__ float operator()(int64_t v) const { return row[v]; }
  __device__ __forceinline__ void keep_term(int64_t v, float e) const { row[v] = e; }
  __device__ __forceinline__ float term(int64_t v, float) const { return row[v]; }
};

// logits[base, base + n) into row[0, n) as FP32: when `vector` says the row start is
// 16-byte aligned, 8 elements (one or two 16-byte loads) per chunk, each thread loading
// kStageChunksInFlight chunks before it stores any, so that it keeps that many loads in flight.
constexpr int kStageChunksInFlight = 4;

template <class T>
__device__ __forceinline__ void stage_row(const T* __restrict__ src, int64_t n, bool vector,
                                          float* __restrict__ row) {
  constexpr int W = 8;
  int64_t done = 0;
  if (vector) {
    const int64_t chunks = n / W;
    for (int64_t k0 = threadIdx.x; k0 < chunks; k0 += kStageChunksInFlight * blockDim.x) {
      float v[kStageChunksInFlight][W];
#pragma unroll
      for (int u = 0; u < kStageChunksInFlight; ++u) {
        const int64_t k = k0 + static_cast<int64_t>(u) * blockDim.x;
        if (k < chunks) load_as_float<W>(src + k * W, v[u]);
      }
#pragma unroll
      for (int u = 0; u < kStageChunksInFlight; ++u) {
        const int64_t k = k0 + static_cast<int64_t>(u) * blockDim.x;
        if (k < chunks) {
          float4* dst = reinterpret_cast<float4*>(row + k * W);
          dst[0] = make_float4(v[u][0], v[u][1], v[u][2], v[u][3]);
          dst[1] = make_float4(v[u][4], v[u][5], v[u][6], v[u][7]);
        }
      }
    }
    done = chunks * W;
  }
  for (int64_t v = done + threadIdx.x; v < n; v += blockDim.x) row[v] = to_float(src[v]);
}

// The three passes over one row, its values z(v) for v < valid_cols (GlobalRow, StagedRow).
template <class Row>
__device__ __forceinline__ void cross_entropy_row(const Row& z, float z_target, bool valid_target,
                                                  int32_t target, float* __restrict__ loss,
                                                  FloatOut dlogits, int64_t base, float grad_scale,
                                                  int64_t V, int64_t valid_cols) {
  // A NaN logit never wins the comparison but makes the sum, hence the loss, NaN.
  float max_logit = -INFINITY;
  for (int64_t v = threadIdx.x; v < valid_cols; v += blockDim.x)
    max_logit = softmax_max(max_logit, z(v));
  max_logit = block_max(max_logit);
  float sum = 0.0f;
  for (int64_t v = threadIdx.x; v < valid_cols; v += blockDim.x) {
    const float e = softmax_exp(z(v), max_logit);
    z.keep_term(v, e);
    sum += e;
  }
  sum = block_sum(sum);
  if (threadIdx.x == 0) *loss = cross_entropy_loss(max_logit, sum, z_target);

  if (dlogits.data == nullptr) return;
  const float inv_sum = 1.0f / sum;
  for (int64_t v = threadIdx.x; v < V; v += blockDim.x) {
    float dz = 0.0f;  // a padding column
    if (v < valid_cols) {
      const float p = z.term(v, max_logit) * inv_sum;
      dz = valid_target ? cross_entropy_grad(p, v == target, grad_scale) : NAN;
    }
    store(dlogits, base + v, dz);
  }
}

__global__ void __launch_bounds__(kCrossEntropyBlock)
    softmax_cross_entropy_kernel(FloatIn logits, const int32_t* __restrict__ targets,
                                 float* __restrict__ losses, FloatOut dlogits, float grad_scale,
                                 int64_t V, int64_t valid_cols) {
  const int64_t base = static_cast<int64_t>(blockIdx.x) * V;
  const int32_t target = targets[blockIdx.x];
  const bool valid_target = target >= 0 && target < valid_cols;
  const float z_target = valid_target ? load(logits, base + target) : NAN;
  cross_entropy_row(GlobalRow{logits, base}, z_target, valid_target, target, losses + blockIdx.x,
                    dlogits, base, grad_scale, V, valid_cols);
}

// The staged kernel: dynamic shared memory of valid_cols floats. `vector`: logits rows start
// 16-byte aligned.
template <class T>
__global__ void __launch_bounds__(kCrossEntropyBlock)
    softmax_cross_entropy_staged_kernel(const T* logits, const int32_t* __restrict__ targets,
                                        float* __restrict__ losses, FloatOut dlogits,
                                        float grad_scale, int64_t V, int64_t valid_cols,
                                        bool vector) {
  extern __shared__ __align__(16) float staged_row[];  // stage_row stores float4
  const int64_t base = static_cast<int64_t>(blockIdx.x) * V;
  const int32_t target = targets[blockIdx.x];
  const bool valid_target = target >= 0 && target < valid_cols;
  const float z_target = valid_target ? to_float(logits[base + target]) : NAN;
  stage_row(logits + base, valid_cols, vector, staged_row);
  __syncthreads();
  cross_entropy_row(StagedRow{staged_row}, z_target, valid_target, target, losses + blockIdx.x,
                    dlogits, base, grad_scale, V, valid_cols);
}

}  // namespace

void CudaBackend::softmax_cross_entropy(const Tensor& logits, int64_t valid_cols,
                                        const Tensor& targets, Tensor& losses, Tensor* dlogits,
                                        float grad_scale) {
  const auto [N, V] =
      check_softmax_cross_entropy(logits, valid_cols, targets, losses, dlogits, device());
  if (N == 0) return;

  const FloatOut grad = dlogits != nullptr ? as_out(*dlogits) : FloatOut{nullptr, DType::kF32};
  const unsigned blocks = static_cast<unsigned>(N);
  // The staged row, plus room for the block reductions' static shared memory.
  const int64_t staged_bytes = valid_cols * static_cast<int64_t>(sizeof(float));
  if (staged_bytes + 1024 <= max_shared_per_block_) {
    const bool vector =
        aligned16(logits.data()) && V * static_cast<int64_t>(dtype_size(logits.dtype())) % 16 == 0;
    dispatch_f32_bf16_f16("softmax_cross_entropy", logits.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const auto kernel = softmax_cross_entropy_staged_kernel<T>;
      allow_shared_bytes(kernel, static_cast<size_t>(staged_bytes));
      kernel<<<blocks, kCrossEntropyBlock, static_cast<size_t>(staged_bytes), stream()>>>(
          logits.data_as<const T>(), targets.data_as<const int32_t>(), losses.data_as<float>(),
          grad, grad_scale, V, valid_cols, vector);
      MANTISSA_CUDA_CHECK_LAUNCH();
    });
    return;
  }
  softmax_cross_entropy_kernel<<<blocks, kCrossEntropyBlock, 0, stream()>>>(
      as_in(logits), targets.data_as<const int32_t>(), losses.data_as<float>(), grad, grad_scale, V,
      valid_cols);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
