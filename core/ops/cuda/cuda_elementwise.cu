// Casts, amax, bias, residual add and GELU on the GPU.
//
// Each kernel reads its storage dtype, computes in FP32 and rounds once with the conversions
// of core/dtype/dtype.h, the same code the CPU backend runs, so casts and adds are
// bit-identical to the CPU's; GELU runs core/ops/math/gelu.h, the CPU's formula compiled to
// the same operations, so it is bit-identical too. The element-wise kernels are grid-stride
// loops over 16-byte packs (see cuda_kernel_utils.cuh) followed by a scalar loop over the
// remainder; a misaligned view takes the scalar loop for everything. Validation is op_checks.h's,
// shared with the CPU backend, so a bad call fails with the same message on both.
#include "core/ops/cuda/cuda_backend.h"
#include "core/ops/cuda/cuda_check.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/ops/math/gelu.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

using namespace cuda_kernels;

constexpr int kBlock = 256;

// ---------------------------------------------------------------------------------------
// cast: dst[i] = round(src[i] * scale) with the input amax fused.

template <class D>
__device__ __forceinline__ D round_element(float y, Saturation saturation, bool stochastic,
                                           RandomStream& random, int64_t index) {
  // Stochastic rounding draws the random number of the element's flat index, so the result
  // does not depend on how the elements are split across threads (or across CPU slices).
  return stochastic ? Rounder<D>::stochastic(y, random(static_cast<uint64_t>(index)), saturation)
                    : Rounder<D>::nearest(y, saturation);
}

// The scale lives on the device (it is produced by the FP8 scaling recipe inside the step),
// so every thread reads it here instead of the host reading it back. The amax is reduced as
// FP32 bit patterns: a per-thread integer max, a block reduction, then one atomicMax per
// block on the output's bits (zeroed by the launcher). That is valid because |x| is
// non-negative, and NaN, whose bits lie above inf's, wins every comparison and propagates.
template <class S, class D, int K>
__global__ void cast_kernel(const S* src, D* dst, int64_t n, int64_t n_packs,
                            const float* __restrict__ scale, uint32_t* __restrict__ amax_bits,
                            Saturation saturation, bool stochastic, uint64_t seed) {
  const float s = scale != nullptr ? *scale : 1.0f;
  RandomStream random(seed);  // random_u32(seed, i), a key per run of 2^32 indices seen
  uint32_t max_bits = 0;
  for (int64_t p = global_thread_index(); p < n_packs; p += grid_stride()) {
    const Pack<S, K> in = load_pack<K>(src + p * K);
    Pack<D, K> out;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const float x = to_float(in.v[k]);
      max_bits = max(max_bits, abs_bits(x));
      out.v[k] = round_element<D>(x * s, saturation, stochastic, random, p * K + k);
    }
    store_pack<K>(dst + p * K, out);
  }
  for (int64_t i = n_packs * K + global_thread_index(); i < n; i += grid_stride()) {
    const float x = to_float(src[i]);
    max_bits = max(max_bits, abs_bits(x));
    dst[i] = round_element<D>(x * s, saturation, stochastic, random, i);
  }
  if (amax_bits != nullptr) {
    max_bits = block_max_u32(max_bits);
    if (threadIdx.x == 0) atomicMax(amax_bits, max_bits);
  }
}

// amax alone: the reduction of cast_kernel without the conversion.
template <class S, int K>
__global__ void amax_kernel(const S* __restrict__ x, int64_t n, int64_t n_packs,
                            uint32_t* __restrict__ amax_bits) {
  uint32_t max_bits = 0;
  for (int64_t p = global_thread_index(); p < n_packs; p += grid_stride()) {
    const Pack<S, K> in = load_pack<K>(x + p * K);
#pragma unroll
    for (int k = 0; k < K; ++k) max_bits = max(max_bits, abs_bits(to_float(in.v[k])));
  }
  for (int64_t i = n_packs * K + global_thread_index(); i < n; i += grid_stride()) {
    max_bits = max(max_bits, abs_bits(to_float(x[i])));
  }
  max_bits = block_max_u32(max_bits);
  if (threadIdx.x == 0) atomicMax(amax_bits, max_bits);
}

// ---------------------------------------------------------------------------------------
// bias

// x[N, C] += bias[C]. A pack never straddles two rows because the vectorised loop runs
// only when C is a multiple of K, so its K bias values are contiguous too. The bias (storage
// type B) widens exactly, so the sum is the CPU's, which widens the whole bias up front.
template <class T, class B, int K>
__global__ void add_bias_kernel(T* __restrict__ x, const B* __restrict__ bias, int64_t n,
                                int64_t n_packs, int64_t columns) {
  for (int64_t p = global_thread_index(); p < n_packs; p += grid_stride()) {
    Pack<T, K> v = load_pack<K>(x + p * K);
    const B* b = bias + (p * K) % columns;
#pragma unroll
    for (int k = 0; k < K; ++k) v.v[k] = round_to<T>(to_float(v.v[k]) + to_float(b[k]));
    store_pack<K>(x + p * K, v);
  }
  for (int64_t i = n_packs * K + global_thread_index(); i < n; i += grid_stride()) {
    x[i] = round_to<T>(to_float(x[i]) + to_float(bias[i % columns]));
  }
}

// First stage of the deterministic column sums: thread (c, block) sums rows
// [block * kColumnRowBlock, (block + 1) * kColumnRowBlock) of column c in row order, the
// CPU backend's order. Consecutive threads read consecutive columns, so every row read is
// coalesced. Each thread loads kColumnRowsInFlight rows before adding them in order (one
// memory latency per that many rows; see kColumnThreads).
template <class T>
__global__ void column_partials_kernel(const T* __restrict__ dout, int64_t rows, int64_t columns,
                                       int64_t n_blocks, float* __restrict__ partials) {
  const int64_t c = global_thread_index();
  if (c >= columns) return;
  for (int64_t block = blockIdx.y; block < n_blocks; block += gridDim.y) {
    const int64_t row_end = min(rows, (block + 1) * kColumnRowBlock);
    float acc = 0.0f;
    int64_t r = block * kColumnRowBlock;
    for (; r + kColumnRowsInFlight <= row_end; r += kColumnRowsInFlight) {
      float v[kColumnRowsInFlight];
#pragma unroll
      for (int u = 0; u < kColumnRowsInFlight; ++u) v[u] = to_float(dout[(r + u) * columns + c]);
#pragma unroll
      for (int u = 0; u < kColumnRowsInFlight; ++u) acc += v[u];
    }
    for (; r < row_end; ++r) acc += to_float(dout[r * columns + c]);
    partials[block * columns + c] = acc;
  }
}

// Second stage: out[c] += the partials of column c added in row-block order, loaded
// kColumnRowsInFlight at a time before they are added (a few hundred threads, each one serial
// chain: without that, one latency per partial or two).
__global__ void add_column_partials_kernel(const float* __restrict__ partials, int64_t n_blocks,
                                           int64_t columns, float* __restrict__ out) {
  for (int64_t c = global_thread_index(); c < columns; c += grid_stride()) {
    float total = partials[c];
    int64_t block = 1;
    for (; block + kColumnRowsInFlight <= n_blocks; block += kColumnRowsInFlight) {
      float v[kColumnRowsInFlight];
#pragma unroll
      for (int u = 0; u < kColumnRowsInFlight; ++u) v[u] = partials[(block + u) * columns + c];
#pragma unroll
      for (int u = 0; u < kColumnRowsInFlight; ++u) total += v[u];
    }
    for (; block < n_blocks; ++block) total += partials[block * columns + c];
    out[c] += total;
  }
}

// ---------------------------------------------------------------------------------------
// residual add. out may alias a or b (each element is read before the same thread writes
// it), so none of the pointers is __restrict__.
template <class T, int K>
__global__ void add_kernel(const T* a, const T* b, T* out, int64_t n, int64_t n_packs) {
  for (int64_t p = global_thread_index(); p < n_packs; p += grid_stride()) {
    const Pack<T, K> va = load_pack<K>(a + p * K);
    const Pack<T, K> vb = load_pack<K>(b + p * K);
    Pack<T, K> sum;
#pragma unroll
    for (int k = 0; k < K; ++k) sum.v[k] = round_to<T>(to_float(va.v[k]) + to_float(vb.v[k]));
    store_pack<K>(out + p * K, sum);
  }
  for (int64_t i = n_packs * K + global_thread_index(); i < n; i += grid_stride()) {
    out[i] = round_to<T>(to_float(a[i]) + to_float(b[i]));
  }
}

// ---------------------------------------------------------------------------------------
// GELU: core/ops/math/gelu.h, the formula the CPU backend runs.

// out may alias x (op_checks), so neither is __restrict__.
template <class T, int K>
__global__ void gelu_forward_kernel(const T* x, T* out, int64_t n, int64_t n_packs) {
  for (int64_t p = global_thread_index(); p < n_packs; p += grid_stride()) {
    const Pack<T, K> in = load_pack<K>(x + p * K);
    Pack<T, K> y;
#pragma unroll
    for (int k = 0; k < K; ++k) y.v[k] = round_to<T>(gelu(to_float(in.v[k])));
    store_pack<K>(out + p * K, y);
  }
  for (int64_t i = n_packs * K + global_thread_index(); i < n; i += grid_stride()) {
    out[i] = round_to<T>(gelu(to_float(x[i])));
  }
}

// dx may alias dout or x, so none is __restrict__.
template <class T, int K>
__global__ void gelu_backward_kernel(const T* x, const T* dout, T* dx, int64_t n, int64_t n_packs) {
  for (int64_t p = global_thread_index(); p < n_packs; p += grid_stride()) {
    const Pack<T, K> in = load_pack<K>(x + p * K);
    const Pack<T, K> dy = load_pack<K>(dout + p * K);
    Pack<T, K> g;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      g.v[k] = round_to<T>(to_float(dy.v[k]) * gelu_grad(to_float(in.v[k])));
    }
    store_pack<K>(dx + p * K, g);
  }
  for (int64_t i = n_packs * K + global_thread_index(); i < n; i += grid_stride()) {
    dx[i] = round_to<T>(to_float(dout[i]) * gelu_grad(to_float(x[i])));
  }
}

}  // namespace

namespace cuda_kernels {

void add_column_partials(const float* partials, int64_t n_blocks, int64_t columns, float* out,
                         int multiprocessor_count, cudaStream_t stream) {
  add_column_partials_kernel<<<grid_size(columns, kBlock, multiprocessor_count), kBlock, 0,
                               stream>>>(partials, n_blocks, columns, out);
  MANTISSA_CUDA_CHECK_LAUNCH();
}

}  // namespace cuda_kernels

// dst = round(src * scale) in dst's dtype; amax (when asked) = max |src| before scaling, NaN
// if any element is NaN. `saturation` applies to FP8 destinations.
void CudaBackend::cast(const Tensor& src, Tensor& dst, const CastParams& params) {
  check_cast(src, dst, params, device());
  const float* scale = params.scale != nullptr ? params.scale->data_as<const float>() : nullptr;
  uint32_t* amax_bits = nullptr;
  if (params.amax != nullptr) {
    amax_bits = params.amax->data_as<uint32_t>();
    // The kernels atomicMax into it: from +0.0f, or from the amax it holds.
    if (!params.accumulate_amax) {
      MANTISSA_CUDA_CHECK(cudaMemsetAsync(amax_bits, 0, sizeof(uint32_t), stream()));
    }
  }
  const int64_t n = src.numel();
  if (n == 0) return;
  const bool stochastic = params.rounding == Rounding::kStochastic;
  dispatch_float("cast", src.dtype(), [&](auto src_tag) {
    dispatch_float("cast", dst.dtype(), [&](auto dst_tag) {
      using S = decltype(src_tag);
      using D = decltype(dst_tag);
      // The narrower operand moves exactly 16 bytes per pack.
      constexpr int K = static_cast<int>(16 / std::min(sizeof(S), sizeof(D)));
      const int64_t n_packs = pack_count<K>(n, {src.data(), dst.data()});
      cast_kernel<S, D, K><<<grid_size(n_packs > 0 ? n_packs : n, kBlock, multiprocessor_count_),
                             kBlock, 0, stream()>>>(src.data_as<const S>(), dst.data_as<D>(), n,
                                                    n_packs, scale, amax_bits, params.saturation,
                                                    stochastic, params.seed);
      MANTISSA_CUDA_CHECK_LAUNCH();
    });
  });
}

void CudaBackend::amax(const Tensor& x, Tensor& out) {
  check_amax(x, out, device());
  uint32_t* out_bits = out.data_as<uint32_t>();
  MANTISSA_CUDA_CHECK(cudaMemsetAsync(out_bits, 0, sizeof(uint32_t), stream()));
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float("amax", x.dtype(), [&](auto tag) {
    using S = decltype(tag);
    constexpr int K = kPackSize<S>;
    const int64_t n_packs = pack_count<K>(n, {x.data()});
    amax_kernel<S, K><<<grid_size(n_packs > 0 ? n_packs : n, kBlock, multiprocessor_count_), kBlock,
                        0, stream()>>>(x.data_as<const S>(), n, n_packs, out_bits);
    MANTISSA_CUDA_CHECK_LAUNCH();
  });
}

// x[N, C] (F32, BF16 or F16) += bias[C] (any of those), one rounding per element.
void CudaBackend::add_bias(Tensor& x, const Tensor& bias) {
  check_add_bias(x, bias, device());
  const int64_t n = x.numel();
  const int64_t columns = x.dim(1);
  if (n == 0) return;
  dispatch_f32_bf16_f16("add_bias", x.dtype(), [&](auto x_tag) {
    dispatch_f32_bf16_f16("add_bias", bias.dtype(), [&](auto bias_tag) {
      using T = decltype(x_tag);
      using B = decltype(bias_tag);
      constexpr int K = kPackSize<T>;
      // The bias is read element by element, so only x's alignment decides the packs.
      const int64_t n_packs = columns % K == 0 ? pack_count<K>(n, {x.data()}) : 0;
      add_bias_kernel<T, B, K>
          <<<grid_size(n_packs > 0 ? n_packs : n, kBlock, multiprocessor_count_), kBlock, 0,
             stream()>>>(x.data_as<T>(), bias.data_as<const B>(), n, n_packs, columns);
      MANTISSA_CUDA_CHECK_LAUNCH();
    });
  });
}

// dbias[C] (F32) += column sums of dout[N, C] (F32, BF16 or F16), in the CPU backend's order
// of additions, so the result is bit-identical to the CPU's.
void CudaBackend::bias_backward(const Tensor& dout, Tensor& dbias) {
  check_bias_backward(dout, dbias, device());
  const int64_t rows = dout.dim(0);
  const int64_t columns = dout.dim(1);
  if (rows == 0 || columns == 0) return;
  const int64_t n_blocks = ceil_div(rows, kColumnRowBlock);
  // Freed when this function returns; the allocator's reuse is ordered on this stream.
  Tensor partials = Tensor::empty(Shape{n_blocks, columns}, DType::kF32, device());
  const dim3 grid(static_cast<unsigned>(ceil_div(columns, kColumnThreads)),
                  static_cast<unsigned>(std::min<int64_t>(n_blocks, 65535)));
  dispatch_f32_bf16_f16("bias_backward", dout.dtype(), [&](auto tag) {
    using T = decltype(tag);
    column_partials_kernel<T><<<grid, kColumnThreads, 0, stream()>>>(
        dout.data_as<const T>(), rows, columns, n_blocks, partials.data_as<float>());
    MANTISSA_CUDA_CHECK_LAUNCH();
  });
  add_column_partials(partials.data_as<const float>(), n_blocks, columns, dbias.data_as<float>(),
                      multiprocessor_count_, stream());
}

// out = a + b, all three of one dtype (F32, BF16 or F16) and shape; out may alias a or b.
void CudaBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_add(a, b, out, device());
  const int64_t n = a.numel();
  if (n == 0) return;
  dispatch_f32_bf16_f16("add", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int K = kPackSize<T>;
    const int64_t n_packs = pack_count<K>(n, {a.data(), b.data(), out.data()});
    add_kernel<T, K>
        <<<grid_size(n_packs > 0 ? n_packs : n, kBlock, multiprocessor_count_), kBlock, 0,
           stream()>>>(a.data_as<const T>(), b.data_as<const T>(), out.data_as<T>(), n, n_packs);
    MANTISSA_CUDA_CHECK_LAUNCH();
  });
}

// out = gelu(x), x and out of one dtype (F32, BF16 or F16) and shape.
void CudaBackend::gelu_forward(const Tensor& x, Tensor& out) {
  check_gelu_forward(x, out, device());
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_f32_bf16_f16("gelu_forward", out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int K = kPackSize<T>;
    const int64_t n_packs = pack_count<K>(n, {x.data(), out.data()});
    gelu_forward_kernel<T, K>
        <<<grid_size(n_packs > 0 ? n_packs : n, kBlock, multiprocessor_count_), kBlock, 0,
           stream()>>>(x.data_as<const T>(), out.data_as<T>(), n, n_packs);
    MANTISSA_CUDA_CHECK_LAUNCH();
  });
}

// dx = dout * gelu'(x), all three of one dtype (F32, BF16 or F16) and shape; dx may alias dout.
void CudaBackend::gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  check_gelu_backward(x, dout, dx, device());
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_f32_bf16_f16("gelu_backward", dx.dtype(), [&](auto tag) {
    using T = decltype(tag);
    constexpr int K = kPackSize<T>;
    const int64_t n_packs = pack_count<K>(n, {x.data(), dout.data(), dx.data()});
    gelu_backward_kernel<T, K>
        <<<grid_size(n_packs > 0 ? n_packs : n, kBlock, multiprocessor_count_), kBlock, 0,
           stream()>>>(x.data_as<const T>(), dout.data_as<const T>(), dx.data_as<T>(), n, n_packs);
    MANTISSA_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mantissa::core
