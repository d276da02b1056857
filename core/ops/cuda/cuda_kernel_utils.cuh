// Building blocks shared by the hand-written kernels (cuda_elementwise.cu, the layer kernels,
// cuda_optim.cu): 16-byte packs, warp and block reductions, launch sizing, dtype dispatch.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <mutex>
#include <utility>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/int_math.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/tensor/tensor.h"

namespace mantissa::core::cuda_kernels {

constexpr int kWarpSize = 32;

// ---------------------------------------------------------------------------------------
// 16-byte packs. A thread that moves K elements with one 16-byte access per 16 bytes (LDG.128
// / STG.128) keeps far more bytes in flight than one moving a scalar, which is what
// memory-bound kernels need to approach the DRAM bandwidth. K is chosen per kernel so that
// the narrowest operand fills exactly 16 bytes; wider operands take several 16-byte accesses.
template <class T, int K>
struct alignas(16) Pack {
  static_assert(sizeof(T) * K % 16 == 0, "a pack is a whole number of 16-byte vectors");
  T v[K];
};

// Elements per pack for kernels whose operands all have storage type T.
template <class T>
constexpr int kPackSize = static_cast<int>(16 / sizeof(T));

template <int K, class T>
__device__ __forceinline__ Pack<T, K> load_pack(const T* p) {
  return *reinterpret_cast<const Pack<T, K>*>(p);
}

template <int K, class T>
__device__ __forceinline__ void store_pack(T* p, const Pack<T, K>& pack) {
  *reinterpret_cast<Pack<T, K>*>(p) = pack;
}

// The vectorised loop of a kernel may take packs only when every pointer it touches is
// 16-byte aligned (a view at an odd offset is not). Returns how many whole packs of K
// elements the loop covers, or 0, in which case the scalar tail loop does all the work.
template <int K>
int64_t pack_count(int64_t n, std::initializer_list<const void*> pointers) {
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return 0;
  }
  return n / K;
}

// ---------------------------------------------------------------------------------------
// Reductions. Every lane of the warp (every thread of the block) gets the result, and the
// order of the additions depends only on the data layout, never on timing, so the results
// are deterministic. warp_sum serves every type __shfl_xor_sync moves (float, double, the
// 64-bit integers of the checksum).
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    v += __shfl_xor_sync(0xFFFFFFFFu, v, offset);
  }
  return v;
}

// max that ignores NaN the way the CPU backend's `a > b ? a : b` scan does: a NaN never wins
// over a number, whichever lane holds it, so every lane ends with the same value (up to the
// sign of a zero).
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarpSize / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(0xFFFFFFFFu, v, offset);
    v = (other > v || v != v) ? other : v;
  }
  return v;
}

__device__ __forceinline__ uint32_t warp_max_u32(uint32_t v) {
  return __reduce_max_sync(0xFFFFFFFFu, v);
}

// Reduces v over the block with the warp reduction `warp_op` (blockDim.x a multiple of 32,
// at most 1024). Safe to call several times in a row: the first barrier keeps a new call
// from overwriting `partial` while a previous call's readers may still be at it.
template <class T, T (*warp_op)(T)>
__device__ __forceinline__ T block_reduce(T v, T identity) {
  __shared__ T partial[kWarpSize];
  const int lane = threadIdx.x % kWarpSize;
  const int warp = threadIdx.x / kWarpSize;
  const int n_warps = blockDim.x / kWarpSize;
  v = warp_op(v);
  __syncthreads();
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  v = lane < n_warps ? partial[lane] : identity;
  return warp_op(v);
}

__device__ __forceinline__ float block_sum(float v) {
  return block_reduce<float, warp_sum<float>>(v, 0.0f);
}
__device__ __forceinline__ float block_max(float v) {
  return block_reduce<float, warp_max>(v, -INFINITY);
}
__device__ __forceinline__ uint32_t block_max_u32(uint32_t v) {
  return block_reduce<uint32_t, warp_max_u32>(v, 0u);
}

// |x| as canonical FP32 bits (core/dtype/dtype.h): an integer max, and atomicMax on the bits,
// gives max |x|.
__device__ __forceinline__ uint32_t abs_bits(float x) {
  return canonical_abs_bits(float_to_bits(x) & 0x7FFFFFFFu);
}

// ---------------------------------------------------------------------------------------
// Launch sizing.

// Blocks for a grid-stride loop over `work` items with `block` threads per block: enough to
// fill every multiprocessor (2048 resident threads each on sm_80 and sm_90), never more than
// the work needs, at least one.
inline int grid_size(int64_t work, int block, int multiprocessor_count) {
  const int64_t full = static_cast<int64_t>(multiprocessor_count) * (2048 / block);
  return static_cast<int>(std::max<int64_t>(1, std::min(ceil_div(work, block), full)));
}

// Lets `kernel` be launched with `bytes` of dynamic shared memory, past the default 48 KiB up
// to the device's opt-in limit (which the caller checks). The attribute is a maximum, which
// every call replaces: it is raised only, to the largest size asked of the kernel on the device
// so far, so that a step's dozens of launches per micro-batch do not each pay the host's
// microseconds for it, and a smaller launch never lowers it below a larger one's.
template <class Kernel>
void allow_shared_bytes(Kernel kernel, size_t bytes) {
  static std::mutex mutex;
  static std::map<std::pair<int, const void*>, size_t> allowed;
  int device = 0;
  MANTISSA_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  size_t& largest = allowed[{device, reinterpret_cast<const void*>(kernel)}];
  if (bytes <= largest) return;
  MANTISSA_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  largest = bytes;
}

// The first global thread index and the stride of a grid-stride loop.
__device__ __forceinline__ int64_t global_thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ int64_t grid_stride() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// ---------------------------------------------------------------------------------------
// Dtype dispatch: calls f(T{}) with T the storage type of `dtype`, for kernels templated on
// their operand types. `op` names the caller in the (unreachable after validation) error.
template <class F>
void dispatch_float(const char* op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: return f(float{});
    case DType::kBF16: return f(bf16{});
    case DType::kF16: return f(fp16{});
    case DType::kE4M3: return f(fp8_e4m3{});
    case DType::kE5M2: return f(fp8_e5m2{});
    default: MANTISSA_FAIL(op << ": " << dtype_name(dtype) << " is not a floating dtype");
  }
}

// F32 and BF16: the gradient dtypes of the optimizer.
template <class F>
void dispatch_f32_bf16(const char* op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: return f(float{});
    case DType::kBF16: return f(bf16{});
    default: MANTISSA_FAIL(op << ": " << dtype_name(dtype) << " is neither f32 nor bf16");
  }
}

// F32, BF16 and F16: the activation dtypes of every elementwise op and layer, the bias dtypes
// of add_bias, the gradient dtypes of sum_squares and unscale_check_finite, and the outputs
// a GEMM with K = 0 scales in place.
template <class F>
void dispatch_f32_bf16_f16(const char* op, DType dtype, F&& f) {
  switch (dtype) {
    case DType::kF32: return f(float{});
    case DType::kBF16: return f(bf16{});
    case DType::kF16: return f(fp16{});
    default: MANTISSA_FAIL(op << ": " << dtype_name(dtype) << " is not f32, bf16 or f16");
  }
}

// ---------------------------------------------------------------------------------------
// Deterministic column sums (bias_backward, layernorm_backward's dgamma and dbeta, rmsnorm's
// dgamma). Rows are taken in fixed blocks of kColumnRowBlock: a first kernel writes one
// partial sum per (row block, column), summed row by row; add_column_partials then adds the
// partials of each column in row-block order into out[C]. The result depends only on the
// shapes, never on the launch configuration or timing. bias_backward matches the CPU backend
// bit for bit (it sums in the same 256-row blocks); the CPU norms sum all rows in order, so
// their parameter gradients agree with the GPU's up to summation order.
constexpr int64_t kColumnRowBlock = 256;

// Launch shape of the first-stage kernels (column_partials_kernel, layernorm's parameter
// partials): blocks of kColumnThreads consecutive columns, each thread loading
// kColumnRowsInFlight rows of its column before it adds them. Each partial is a serial chain
// of up to 256 additions, so the loads a thread has in flight, not the thread count, decide
// the bandwidth; 64-thread blocks spread even C = 768 columns (x 64 row blocks) over every
// multiprocessor.
constexpr int kColumnThreads = 64;
constexpr int kColumnRowsInFlight = 32;

// out[c] += partials[0, c] + partials[1, c] + ... + partials[n_blocks - 1, c]
// (partials is [n_blocks, C], F32). Defined in cuda_elementwise.cu.
void add_column_partials(const float* partials, int64_t n_blocks, int64_t columns, float* out,
                         int multiprocessor_count, cudaStream_t stream);

}  // namespace mantissa::core::cuda_kernels
