// How the CPU layer ops (cpu_layernorm.cpp, cpu_attention.cpp, cpu_embedding.cpp,
// cpu_cross_entropy.cpp) read and write their operands.
//
// Every op widens its activations (F32, BF16 or F16) into FP32 rows, computes in FP32 and
// rounds once, to nearest even, when it stores a result; parameters may be F32 or BF16 (the
// compute copy) and their gradients are F32. Work is split across OpenMP threads by rows,
// by (batch, head) or by blocks of channels, and every sum runs in an order fixed by the
// data alone, so results are bit-identical whatever the number of threads. In particular
// the parameter-gradient reductions (dgamma, dbeta, dwte, dwpe) are split by channel, so no
// two threads ever add into the same element.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/ops/op_checks.h"
#include "core/tensor/tensor.h"

namespace mantissa::core::cpu_layer_io {

// The parameter-gradient reductions give each thread this many channels at a time: wide
// enough for full AVX2 vectors, narrow enough that C = 384 still makes a dozen tasks.
inline constexpr int64_t kChannelBlock = 32;

template <class T>
void widen(const T* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_float(src[i]);
}

template <class T>
void narrow(const float* src, int64_t n, T* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = round_to<T>(src[i]);
}

// dst[0, n) = elements [offset, offset + n) of a floating tensor, widened exactly to FP32.
// The dtype was validated on entry to the op, so F32 is the only remaining case.
inline void load(const Tensor& t, int64_t offset, int64_t n, float* dst) {
  if (t.dtype() == DType::kBF16) {
    widen(t.data_as<const bf16>() + offset, n, dst);
  } else if (t.dtype() == DType::kF16) {
    widen(t.data_as<const fp16>() + offset, n, dst);
  } else {
    std::memcpy(dst, t.data_as<const float>() + offset, static_cast<size_t>(n) * sizeof(float));
  }
}

// Elements [offset, offset + n) of a floating tensor = src rounded to its dtype.
inline void store(const float* src, int64_t n, const Tensor& t, int64_t offset) {
  if (t.dtype() == DType::kBF16) {
    narrow(src, n, t.data_as<bf16>() + offset);
  } else if (t.dtype() == DType::kF16) {
    narrow(src, n, t.data_as<fp16>() + offset);
  } else {
    std::memcpy(t.data_as<float>() + offset, src, static_cast<size_t>(n) * sizeof(float));
  }
}

inline std::vector<float> load_all(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  load(t, 0, t.numel(), out.data());
  return out;
}

// Tokens or targets are indices into a table of `limit` rows; an index outside it would read
// or write out of bounds, so it is reported with its position before any work starts.
inline void check_indices(const char* op, const char* name, const Tensor& indices, int64_t limit) {
  const int32_t* idx = indices.data_as<const int32_t>();
  for (int64_t i = 0; i < indices.numel(); ++i) {
    if (idx[i] < 0 || idx[i] >= limit) fail_index_out_of_range(op, name, indices, i, idx[i], limit);
  }
}

}  // namespace mantissa::core::cpu_layer_io
