// The device-side check of token and target indices (see cuda_layer_io.cuh). The rest of the
// validation is op_checks.h's, shared with the CPU backend.
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/cuda/cuda_layer_io.cuh"
#include "core/ops/op_checks.h"

namespace mantissa::core::cuda_kernels {
namespace {

constexpr int kBlock = 256;

// Records the smallest flat index whose value lies outside [0, limit). first_bad starts as
// all ones (no bad index) and only ever decreases; a thread's own indices increase, so it
// stops at its first bad one.
__global__ void find_bad_index_kernel(const int32_t* __restrict__ indices, int64_t n, int64_t limit,
                                      unsigned long long* __restrict__ first_bad) {
  for (int64_t i = global_thread_index(); i < n; i += grid_stride()) {
    const int32_t v = indices[i];
    if (v < 0 || v >= limit) {
      atomicMin(first_bad, static_cast<unsigned long long>(i));
      return;
    }
  }
}

}  // namespace

void check_indices(const char* op, const char* name, const Tensor& indices, int64_t limit,
                   int multiprocessor_count, cudaStream_t stream) {
  const int64_t n = indices.numel();
  if (n == 0) return;
  Tensor first_bad = Tensor::empty(Shape{1}, DType::kI64, indices.device());
  MANTISSA_CUDA_CHECK(cudaMemsetAsync(first_bad.data(), 0xFF, sizeof(uint64_t), stream));
  find_bad_index_kernel<<<grid_size(n, kBlock, multiprocessor_count), kBlock, 0, stream>>>(
      indices.data_as<const int32_t>(), n, limit, first_bad.data_as<unsigned long long>());
  MANTISSA_CUDA_CHECK_LAUNCH();
  uint64_t bad = 0;
  MANTISSA_CUDA_CHECK(
      cudaMemcpyAsync(&bad, first_bad.data(), sizeof bad, cudaMemcpyDeviceToHost, stream));
  MANTISSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  if (bad == ~uint64_t{0}) return;
  const auto i = static_cast<int64_t>(bad);
  int32_t value = 0;
  MANTISSA_CUDA_CHECK(cudaMemcpyAsync(&value, indices.data_as<const int32_t>() + i, sizeof value,
                                      cudaMemcpyDeviceToHost, stream));
  MANTISSA_CUDA_CHECK(cudaStreamSynchronize(stream));
  fail_index_out_of_range(op, name, indices, i, value, limit);
}

}  // namespace mantissa::core::cuda_kernels
