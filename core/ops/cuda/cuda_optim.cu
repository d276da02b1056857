// AdamW, sums of squares (for the global gradient norm) and the fused unscale + non-finite
// check on the GPU, mirroring cpu_optim.cpp: the same validation (op_checks.h, shared with
// it), the same formulas (AdamW's is core/ops/math/adamw_update.h, compiled for both), the
// same results (AdamW and sum_squares to an FP32 rounding or two, unscale bit for bit).
//
// The reductions are deterministic: sum_squares splits the work by a grid whose size
// depends only on the tensor and adds the per-block results in block order, and
// unscale_check_finite combines its per-thread answers with an order-free operation (the
// minimum index).
#include <algorithm>
#include <span>
#include <type_traits>

#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/math/adamw_update.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;

// ---------------------------------------------------------------------------------------
// AdamW

// Stands for "no compute copy" in adamw_kernel.
struct NoCopy {};

// Ranges one launch updates: the kernel's parameters must fit the 4 KB every CUDA version
// accepts (this leaves room for about 30 more). GPT-2 124M has 148 parameter tensors, a 16-layer
// Llama 99, so their whole update is one launch.
constexpr int kRangesPerLaunch = 160;

// Part of the flat buffers for one launch, passed by value in the kernel's parameters (no
// table to upload): per range its offset and element count, whether every operand is 16-byte
// aligned there (so it moves in packs), and its weight decay (0 where the range does not
// decay).
struct AdamWLaunchRanges {
  int64_t offset[kRangesPerLaunch];
  int64_t numel[kRangesPerLaunch];
  float weight_decay[kRangesPerLaunch];
  bool packed[kRangesPerLaunch];
  int count;
};
static_assert(sizeof(AdamWLaunchRanges) + 5 * sizeof(void*) + sizeof(AdamWCoefficients) <= 4096,
              "adamw_kernel's parameters must fit the 4 KB every CUDA version accepts");

// adamw_update (core/ops/math/adamw_update.h, the CPU backend's formula) in one pass over
// params, grads, m, v (and the compute copy, when C is a storage type rather than NoCopy),
// range after range, each range spread over the whole grid: the updated parameter is rounded
// into the copy while it is in registers, saving a second pass over the parameters. K = 8
// elements per pack, so every operand moves whole 16-byte vectors (two for the F32 ones).
template <class G, class C, int K>
__global__ void adamw_kernel(float* __restrict__ params, const G* __restrict__ grads,
                             float* __restrict__ m, float* __restrict__ v, C* __restrict__ copy,
                             __grid_constant__ const AdamWLaunchRanges ranges,
                             AdamWCoefficients k) {
  constexpr bool kHasCopy = !std::is_same_v<C, NoCopy>;
  for (int r = 0; r < ranges.count; ++r) {
    const int64_t base = ranges.offset[r];
    const int64_t n = ranges.numel[r];
    const int64_t n_packs = ranges.packed[r] ? n / K : 0;
    k.weight_decay = ranges.weight_decay[r];
    for (int64_t p = global_thread_index(); p < n_packs; p += grid_stride()) {
      const int64_t i = base + p * K;
      Pack<float, K> param = load_pack<K>(params + i);
      const Pack<G, K> grad = load_pack<K>(grads + i);
      Pack<float, K> m_pack = load_pack<K>(m + i);
      Pack<float, K> v_pack = load_pack<K>(v + i);
#pragma unroll
      for (int j = 0; j < K; ++j) {
        param.v[j] = adamw_update(param.v[j], to_float(grad.v[j]), m_pack.v[j], v_pack.v[j], k);
      }
      store_pack<K>(params + i, param);
      store_pack<K>(m + i, m_pack);
      store_pack<K>(v + i, v_pack);
      if constexpr (kHasCopy) {
        Pack<C, K> rounded;
#pragma unroll
        for (int j = 0; j < K; ++j) rounded.v[j] = round_to<C>(param.v[j]);
        store_pack<K>(copy + i, rounded);
      }
    }
    for (int64_t i = base + n_packs * K + global_thread_index(); i < base + n; i += grid_stride()) {
      const float updated = adamw_update(params[i], to_float(grads[i]), m[i], v[i], k);
      params[i] = updated;
      if constexpr (kHasCopy) copy[i] = round_to<C>(updated);
    }
  }
}

// One launch per kRangesPerLaunch non-empty ranges, the grid sized for the largest range of
// the launch (every range is spread over the whole grid).
template <class G, class C>
void launch_adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, C* copy,
                  std::span<const ParamRange> ranges, const AdamWCoefficients& k,
                  int multiprocessor_count, cudaStream_t stream) {
  constexpr int K = 8;
  float* const param_data = params.data_as<float>();
  const G* const grad_data = grads.data_as<const G>();
  float* const m_data = m.data_as<float>();
  float* const v_data = v.data_as<float>();
  size_t next = 0;
  while (next < ranges.size()) {
    AdamWLaunchRanges launch{};
    int64_t largest = 0;
    for (; next < ranges.size() && launch.count < kRangesPerLaunch; ++next) {
      const ParamRange& range = ranges[next];
      if (range.numel == 0) continue;
      const int64_t o = range.offset;
      const int64_t n_packs =
          pack_count<K>(range.numel, {param_data + o, grad_data + o, m_data + o, v_data + o,
                                      copy == nullptr ? nullptr : copy + o});
      const int i = launch.count++;
      launch.offset[i] = o;
      launch.numel[i] = range.numel;
      launch.packed[i] = n_packs > 0;
      launch.weight_decay[i] = range.weight_decay ? k.weight_decay : 0.0f;
      largest = std::max(largest, n_packs > 0 ? n_packs : range.numel);
    }
    if (launch.count == 0) break;
    adamw_kernel<G, C, K><<<grid_size(largest, kBlock, multiprocessor_count), kBlock, 0, stream>>>(
        param_data, grad_data, m_data, v_data, copy, launch, k);
    MANTISSA_CUDA_CHECK_LAUNCH();
  }
}

// ---------------------------------------------------------------------------------------
// sum_squares

// At most this many blocks, each writing one partial sum: a grid that depends only on the
// tensor (its element count and whether it is 16-byte aligned), never on the device, so the
// order of the additions, hence the result, is the same on every GPU.
constexpr int kSumSquaresBlocks = 1024;

// Squares are accumulated in FP64, as on the CPU: the square of an FP32 value is exact there
// (even where its FP32 square would fall into the subnormals and lose digits), and the result
// is rounded to FP32 once.
template <class T, int K>
__global__ void sum_squares_partials_kernel(const T* __restrict__ x, int64_t n, int64_t n_packs,
                                            double* __restrict__ partials) {
  double sum = 0.0;
  for (int64_t p = global_thread_index(); p < n_packs; p += grid_stride()) {
    const Pack<T, K> pack = load_pack<K>(x + p * K);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const double xi = to_float(pack.v[k]);
      sum += xi * xi;
    }
  }
  for (int64_t i = n_packs * K + global_thread_index(); i < n; i += grid_stride()) {
    const double xi = to_float(x[i]);
    sum += xi * xi;
  }
  sum = block_reduce<double, warp_sum<double>>(sum, 0.0);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// One block: out += the partials, summed in FP64, rounded to FP32 once.
__global__ void sum_squares_finish_kernel(const double* __restrict__ partials, int n_partials,
                                          float* __restrict__ out) {
  double sum = 0.0;
  for (int i = threadIdx.x; i < n_partials; i += blockDim.x) sum += partials[i];
  sum = block_reduce<double, warp_sum<double>>(sum, 0.0);
  if (threadIdx.x == 0) *out = static_cast<float>(static_cast<double>(*out) + sum);
}

// ---------------------------------------------------------------------------------------
// unscale_check_finite

// x *= inv_scale in place, judging finiteness on the values before scaling. Each thread
// meets its elements in increasing index order, so the first non-finite one it sees is its
// smallest; it then raises `found` (a plain store: every writer writes the same 1) and
// offers that index to an atomicMin on first_index, which the launcher set to all ones, the
// bit pattern of -1 as an int64 and the largest value as an unsigned one. Non-finite values
// are rare, so the atomics are too.
template <class T, int K>
__global__ void unscale_check_finite_kernel(T* __restrict__ x, int64_t n, int64_t n_packs,
                                            float inv_scale, float* __restrict__ found,
                                            unsigned long long* __restrict__ first_index) {
  int64_t first = -1;
  for (int64_t p = global_thread_index(); p < n_packs; p += grid_stride()) {
    Pack<T, K> pack = load_pack<K>(x + p * K);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float xk = to_float(pack.v[k]);
      if (first < 0 && is_nonfinite_bits(xk)) first = p * K + k;
      pack.v[k] = round_to<T>(xk * inv_scale);
    }
    store_pack<K>(x + p * K, pack);
  }
  for (int64_t i = n_packs * K + global_thread_index(); i < n; i += grid_stride()) {
    const float xi = to_float(x[i]);
    if (first < 0 && is_nonfinite_bits(xi)) first = i;
    x[i] = round_to<T>(xi * inv_scale);
  }
  if (first >= 0) {
    *found = 1.0f;
    if (first_index != nullptr) atomicMin(first_index, static_cast<unsigned long long>(first));
  }
}

}  // namespace

// AdamW on F32 params, m, v of one shape; grads F32 or BF16 of that shape. compute_copy, when
// given, is F32, BF16 or F16 (FP8 compute copies need a scale and are made with cast()).
void CudaBackend::adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                        Tensor* compute_copy, std::span<const ParamRange> ranges,
                        const AdamWParams& p) {
  check_adamw(params, grads, m, v, compute_copy, ranges, p, device());
  const AdamWCoefficients k = adamw_coefficients(p);
  dispatch_f32_bf16("adamw", grads.dtype(), [&](auto grad_tag) {
    using G = decltype(grad_tag);
    if (compute_copy == nullptr) {
      launch_adamw<G, NoCopy>(params, grads, m, v, nullptr, ranges, k, multiprocessor_count_,
                              stream());
      return;
    }
    dispatch_f32_bf16_f16("adamw", compute_copy->dtype(), [&](auto copy_tag) {
      using C = decltype(copy_tag);
      launch_adamw<G, C>(params, grads, m, v, compute_copy->data_as<C>(), ranges, k,
                         multiprocessor_count_, stream());
    });
  });
}

// out (F32 scalar) += sum x^2 for x F32, BF16 or F16, accumulated in FP64 and rounded once.
void CudaBackend::sum_squares(const Tensor& x, Tensor& out) {
  check_sum_squares(x, out, device());
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_f32_bf16_f16("sum_squares", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int K = kPackSize<T>;
    const int64_t n_packs = pack_count<K>(n, {x.data()});
    const int blocks = static_cast<int>(
        std::min<int64_t>(kSumSquaresBlocks, ceil_div(n_packs > 0 ? n_packs : n, kBlock)));
    // One 8-byte slot per block for its FP64 partial (there is no F64 dtype). Freed when
    // this function returns; the allocator's reuse is ordered on this stream.
    Tensor partials = Tensor::empty(Shape{blocks}, DType::kI64, device());
    double* partial_sums = static_cast<double*>(partials.data());
    sum_squares_partials_kernel<T, K>
        <<<blocks, kBlock, 0, stream()>>>(x.data_as<const T>(), n, n_packs, partial_sums);
    MANTISSA_CUDA_CHECK_LAUNCH();
    sum_squares_finish_kernel<<<1, kBlock, 0, stream()>>>(partial_sums, blocks,
                                                          out.data_as<float>());
    MANTISSA_CUDA_CHECK_LAUNCH();
  });
}

// x (F32, BF16 or F16) *= inv_scale in place. Finiteness is judged on the values before
// scaling: found (F32 scalar) becomes 1 when any element is inf or NaN and is otherwise left
// as it was; first_index (I64 scalar), when given, is overwritten with the smallest such
// index or -1.
void CudaBackend::unscale_check_finite(Tensor& x, float inv_scale, Tensor& found,
                                       Tensor* first_index) {
  check_unscale_check_finite(x, inv_scale, found, first_index, device());
  unsigned long long* first = nullptr;
  if (first_index != nullptr) {
    first = first_index->data_as<unsigned long long>();
    MANTISSA_CUDA_CHECK(cudaMemsetAsync(first, 0xFF, sizeof(int64_t), stream()));  // -1
  }
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_f32_bf16_f16("unscale_check_finite", x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int K = kPackSize<T>;
    const int64_t n_packs = pack_count<K>(n, {x.data()});
    unscale_check_finite_kernel<T, K>
        <<<grid_size(n_packs > 0 ? n_packs : n, kBlock, multiprocessor_count_), kBlock, 0,
           stream()>>>(x.data_as<T>(), n, n_packs, inv_scale, found.data_as<float>(), first);
    MANTISSA_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mantissa::core
