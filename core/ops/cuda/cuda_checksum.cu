// The consistency check's checksum on the GPU, the same terms as cpu_checksum.cpp
// (core/ops/math/checksum.h): the replicas' weights are summed where they are, and the host
// reads 8 bytes instead of copying the whole buffer out (498 MB for GPT-2 124M's masters).
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/math/checksum.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;

// Each thread sums its words' terms (and at most one tail byte), each block its threads', and
// the blocks add theirs into *out: additions mod 2^64 in any order, so the result is exact.
__global__ void checksum_kernel(const uint64_t* __restrict__ words, int64_t n_words,
                                const uint8_t* __restrict__ tail, int tail_bytes,
                                unsigned long long* __restrict__ out) {
  unsigned long long sum = 0;
  for (int64_t i = global_thread_index(); i < n_words; i += grid_stride()) {
    sum += checksum_word(words[i], static_cast<uint64_t>(i));
  }
  const int64_t t = global_thread_index();
  if (t < tail_bytes) sum += checksum_tail_byte(tail[t], static_cast<uint64_t>(n_words * 8 + t));
  sum = block_reduce<unsigned long long, warp_sum<unsigned long long>>(sum, 0ull);
  if (threadIdx.x == 0) atomicAdd(out, sum);
}

}  // namespace

void CudaBackend::checksum(const Tensor& x, Tensor& out) {
  check_checksum(x, out, device());
  auto* sum = out.data_as<unsigned long long>();
  MANTISSA_CUDA_CHECK(cudaMemsetAsync(sum, 0, sizeof(*sum), stream()));
  const int64_t n_words = static_cast<int64_t>(x.nbytes() / 8);
  const int tail_bytes = static_cast<int>(x.nbytes() % 8);
  if (n_words == 0 && tail_bytes == 0) return;
  const auto* bytes = static_cast<const uint8_t*>(x.data());
  checksum_kernel<<<grid_size(n_words > 0 ? n_words : 1, kBlock, multiprocessor_count_), kBlock, 0,
                    stream()>>>(reinterpret_cast<const uint64_t*>(bytes), n_words,
                                bytes + n_words * 8, tail_bytes, sum);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace mantissa::core
