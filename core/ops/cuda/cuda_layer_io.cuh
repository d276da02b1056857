// How the CUDA layer kernels (cuda_layernorm.cu, cuda_attention.cu, cuda_embedding.cu,
// cuda_cross_entropy.cu) read and write their operands.
//
// The operands of these ops may each be F32, BF16 or F16 independently (activations, and
// parameters: the FP32 masters or a BF16 or F16 compute copy), so instead of templating
// every kernel on every combination the kernels see their operands as FloatIn / FloatOut: a
// pointer and a dtype, switched on per access. The dtype is the same for the whole grid, so
// the switch is a uniform branch, not divergence; LayerNorm forward, the one memory-bound
// kernel that the benchmarks watch, also has a path with 16-byte accesses (load_chunk,
// store_chunk). Every value is computed in FP32 and rounded once, to nearest even, when
// stored, as the CPU backend does (cpu_layer_io.h).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype/dtype.h"
#include "core/ops/cuda/cuda_kernel_utils.cuh"
#include "core/tensor/tensor.h"

namespace mantissa::core::cuda_kernels {

// Operands with a run-time dtype (F32, BF16 or F16).

struct FloatIn {
  const void* data;
  DType dtype;
};
struct FloatOut {
  void* data;
  DType dtype;
};

inline FloatIn as_in(const Tensor& t) {
  return {t.data(), t.dtype()};
}
inline FloatOut as_out(Tensor& t) {
  return {t.data(), t.dtype()};
}

__device__ __forceinline__ float load(FloatIn t, int64_t i) {
  switch (t.dtype) {
    case DType::kBF16: return bf16_to_float(static_cast<const bf16*>(t.data)[i]);
    case DType::kF16: return fp16_to_float(static_cast<const fp16*>(t.data)[i]);
    default: return static_cast<const float*>(t.data)[i];
  }
}

__device__ __forceinline__ void store(FloatOut t, int64_t i, float v) {
  switch (t.dtype) {
    case DType::kBF16: static_cast<bf16*>(t.data)[i] = bf16_from_float(v); break;
    case DType::kF16: static_cast<fp16*>(t.data)[i] = fp16_from_float(v); break;
    default: static_cast<float*>(t.data)[i] = v;
  }
}

// W consecutive elements starting at i: with W = 8 one 16-byte access (two for F32), which
// needs i * sizeof(element) and the base pointer 16-byte aligned; with W = 1 a scalar.
template <int W, class T>
__device__ __forceinline__ void load_as_float(const T* p, float (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = to_float(p[0]);
  } else {
    const Pack<T, W> pack = load_pack<W>(p);
#pragma unroll
    for (int k = 0; k < W; ++k) v[k] = to_float(pack.v[k]);
  }
}

template <int W, class T>
__device__ __forceinline__ void store_from_float(T* p, const float (&v)[W]) {
  if constexpr (W == 1) {
    p[0] = round_to<T>(v[0]);
  } else {
    Pack<T, W> pack;
#pragma unroll
    for (int k = 0; k < W; ++k) pack.v[k] = round_to<T>(v[k]);
    store_pack<W>(p, pack);
  }
}

template <int W>
__device__ __forceinline__ void load_chunk(FloatIn t, int64_t i, float (&v)[W]) {
  switch (t.dtype) {
    case DType::kBF16: return load_as_float<W>(static_cast<const bf16*>(t.data) + i, v);
    case DType::kF16: return load_as_float<W>(static_cast<const fp16*>(t.data) + i, v);
    default: return load_as_float<W>(static_cast<const float*>(t.data) + i, v);
  }
}

template <int W>
__device__ __forceinline__ void store_chunk(FloatOut t, int64_t i, const float (&v)[W]) {
  switch (t.dtype) {
    case DType::kBF16: return store_from_float<W>(static_cast<bf16*>(t.data) + i, v);
    case DType::kF16: return store_from_float<W>(static_cast<fp16*>(t.data) + i, v);
    default: return store_from_float<W>(static_cast<float*>(t.data) + i, v);
  }
}

inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

}  // namespace mantissa::core::cuda_kernels
