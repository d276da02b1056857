// Casts, amax, bias, residual add and GELU on the CPU.
//
// Every loop reads its storage dtype, computes in FP32 and rounds once to the output dtype
// with the conversions of core/dtype/dtype.h, so the results match the GPU's wherever the
// arithmetic is exactly specified (casts, adds); GELU runs core/ops/math/gelu.h, the formula
// the GPU runs too. Loops are written to vectorise: no libm calls in the hot loops, and
// selects rather than branches. (GCC still keeps the GELU loops scalar under its default
// -ftrapping-math: it turns the clamps into branches and then may not speculate the
// arithmetic behind them. -fno-trapping-math, which changes no result, lets it vectorise
// them.) Large loops are split across OpenMP threads.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/int_math.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_convert.h"
#include "core/ops/cpu/cpu_narrow_avx512.h"
#include "core/ops/math/gelu.h"
#include "core/ops/op_checks.h"
#include "core/precision/fp8_scale.h"

namespace mantissa::core {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

// A cast from a reduced-precision source is done slice by slice: each slice is widened into
// an FP32 scratch buffer (64 KiB, which stays in L2) and narrowed from there.
constexpr int64_t kCastSlice = 1 << 14;

// bias_backward sums fixed blocks of rows into per-block partial sums, then adds the
// partials in block order: the result does not depend on the thread count.
constexpr int64_t kBiasRowBlock = 256;

// ---------------------------------------------------------------------------------------
// cast

// Widens each slice of a non-F32 source to FP32, then narrows it with index_base set to
// the slice's offset, so that stochastic rounding draws the same random numbers as a
// conversion of the whole array would. Returns max |src| as narrow_from_f32 does.
float cast_through_f32(const Tensor& src, Tensor& dst, const NarrowOptions& options) {
  const int64_t n = src.numel();
  const int64_t n_slices = ceil_div(n, kCastSlice);
  const auto* in = static_cast<const unsigned char*>(src.data());
  auto* out = static_cast<unsigned char*>(dst.data());
  const size_t in_width = dtype_size(src.dtype());
  const size_t out_width = dtype_size(dst.dtype());
  float amax = 0.0f;
  bool saw_nan = false;
#pragma omp parallel if (n_slices > 1) reduction(max : amax) reduction(|| : saw_nan)
  {
    std::vector<float> scratch(static_cast<size_t>(std::min(n, kCastSlice)));
#pragma omp for schedule(static)
    for (int64_t s = 0; s < n_slices; ++s) {
      const int64_t begin = s * kCastSlice;
      const int64_t count = std::min(kCastSlice, n - begin);
      widen_to_f32(in + begin * in_width, src.dtype(), scratch.data(), count);
      NarrowOptions slice = options;
      slice.index_base = options.index_base + static_cast<uint64_t>(begin);
      const float slice_amax =
          narrow_from_f32(scratch.data(), out + begin * out_width, dst.dtype(), count, slice);
      // NaN is tracked on the side: a max reduction would drop it.
      saw_nan = saw_nan || std::isnan(slice_amax);
      amax = std::fmax(amax, slice_amax);
    }
  }
  return saw_nan ? NAN : amax;
}

// ---------------------------------------------------------------------------------------
// amax

// The FP32 bit pattern of |x| (sign cleared) orders like |x| itself when compared as an
// unsigned integer, and every NaN pattern lies above inf. An integer max therefore gives
// max |x| and propagates NaN without a branch, and it vectorises.
template <class T>
float amax_of(const T* x, int64_t n) {
  uint32_t max_bits = 0;
#pragma omp parallel for simd schedule(static) reduction(max : max_bits) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    max_bits = std::max(max_bits, float_to_bits(to_float(x[i])) & 0x7FFFFFFFu);
  }
  return bits_to_float(max_bits);
}

// ---------------------------------------------------------------------------------------
// bias

template <class T>
void add_bias_rows(T* x, const float* bias, int64_t rows, int64_t cols) {
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t r = 0; r < rows; ++r) {
    T* row = x + r * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) row[c] = round_to<T>(to_float(row[c]) + bias[c]);
  }
}

// dbias[c] += sum_r dout[r, c] in FP32. Each block of kBiasRowBlock rows is summed row by
// row into its own partial vector (contiguous, vectorised over c); the partials are then
// added in block order, which also keeps the FP32 error growing with the block count
// rather than with the row count.
template <class T>
void add_column_sums(const T* dout, float* dbias, int64_t rows, int64_t cols) {
  if (rows == 0) return;
  const int64_t n_blocks = ceil_div(rows, kBiasRowBlock);
  std::vector<float> partial(static_cast<size_t>(n_blocks * cols));
#pragma omp parallel for schedule(static) if (rows * cols > kParallelMin)
  for (int64_t b = 0; b < n_blocks; ++b) {
    float* acc = partial.data() + b * cols;
    std::fill(acc, acc + cols, 0.0f);
    const int64_t row_end = std::min(rows, (b + 1) * kBiasRowBlock);
    for (int64_t r = b * kBiasRowBlock; r < row_end; ++r) {
      const T* row = dout + r * cols;
#pragma omp simd
      for (int64_t c = 0; c < cols; ++c) acc[c] += to_float(row[c]);
    }
  }
  float* total = partial.data();
  for (int64_t b = 1; b < n_blocks; ++b) {
    const float* acc = partial.data() + b * cols;
#pragma omp simd
    for (int64_t c = 0; c < cols; ++c) total[c] += acc[c];
  }
#pragma omp simd
  for (int64_t c = 0; c < cols; ++c) dbias[c] += total[c];
}

// ---------------------------------------------------------------------------------------
// residual add

// out may alias a or b: each element is read before the same element is written.
template <class T>
void add_elements(const T* a, const T* b, T* out, int64_t n) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) out[i] = round_to<T>(to_float(a[i]) + to_float(b[i]));
}

// ---------------------------------------------------------------------------------------
// GELU

// The formula is core/ops/math/gelu.h's, shared with the CUDA backend. The loops over a span
// are written once and compiled twice: for the library's AVX2 target, and inlined into
// AVX-512 functions, which run sixteen lanes where avx512::narrow_enabled() (the same
// operations lane by lane, so the same bits; tests/core/test_cpu_elementwise.cpp holds both to
// the scalar formula over every BF16 and F16 value). The threads split the elements first, so
// that each runs its span on one of them.
template <class T>
[[gnu::always_inline]] inline void gelu_forward_span(const T* x, T* out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = round_to<T>(gelu(to_float(x[i])));
}

template <class T>
[[gnu::always_inline]] inline void gelu_backward_span(const T* x, const T* dout, T* dx, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    dx[i] = round_to<T>(to_float(dout[i]) * gelu_grad(to_float(x[i])));
  }
}

#define MANTISSA_AVX512 gnu::target("avx512f,avx512bw,avx512vl,avx512dq")
template <class T>
[[MANTISSA_AVX512]] void gelu_forward_avx512(const T* x, T* out, int64_t n) {
  gelu_forward_span(x, out, n);
}
template <class T>
[[MANTISSA_AVX512]] void gelu_backward_avx512(const T* x, const T* dout, T* dx, int64_t n) {
  gelu_backward_span(x, dout, dx, n);
}
#undef MANTISSA_AVX512

// Calls span(begin, count) for this thread's share of [0, n) (all of it outside a parallel
// region), in whole 64-byte lines of T where the share is not the last.
template <class T, class Span>
void for_this_threads_share(int64_t n, const Span& span) {
  const int64_t threads = omp_get_num_threads(), thread = omp_get_thread_num();
  const int64_t line = 64 / static_cast<int64_t>(sizeof(T));
  const int64_t share = ceil_div(n, threads);
  const int64_t per_thread = round_up(share, line);
  const int64_t begin = std::min(n, thread * per_thread);
  span(begin, std::min(n, begin + per_thread) - begin);
}

template <class T>
void gelu_forward_elements(const T* x, T* out, int64_t n) {
  const bool wide = avx512::narrow_enabled();
#pragma omp parallel if (n > kParallelMin)
  for_this_threads_share<T>(n, [&](int64_t begin, int64_t count) {
    if (wide) return gelu_forward_avx512(x + begin, out + begin, count);
    gelu_forward_span(x + begin, out + begin, count);
  });
}

template <class T>
void gelu_backward_elements(const T* x, const T* dout, T* dx, int64_t n) {
  const bool wide = avx512::narrow_enabled();
#pragma omp parallel if (n > kParallelMin)
  for_this_threads_share<T>(n, [&](int64_t begin, int64_t count) {
    if (wide) return gelu_backward_avx512(x + begin, dout + begin, dx + begin, count);
    gelu_backward_span(x + begin, dout + begin, dx + begin, count);
  });
}

// Calls f(T*) with the tensor's data typed as float, bf16 or fp16 (the activation dtypes).
template <class F>
void with_activation_type(const Tensor& t, F&& f) {
  switch (t.dtype()) {
    case DType::kF32: return f(t.data_as<float>());
    case DType::kBF16: return f(t.data_as<bf16>());
    default: return f(t.data_as<fp16>());
  }
}

}  // namespace

// dst = round(src * scale) in dst's dtype; amax (when asked) = max |src| before scaling, NaN
// if any element is NaN. `saturation` applies to FP8 destinations (BF16 and F16 overflow to
// inf as their hardware conversions do). F32 sources, and BF16 or F16 ones rounded to nearest,
// are narrowed directly, without a scratch copy; other sources go through FP32 slices.
void CpuBackend::cast(const Tensor& src, Tensor& dst, const CastParams& params) {
  check_cast(src, dst, params, device());
  NarrowOptions options;
  if (params.scale != nullptr) options.scale = params.scale->data_as<float>()[0];
  options.saturation = params.saturation;
  options.stochastic = params.rounding == Rounding::kStochastic;
  options.seed = params.seed;
  options.want_amax = params.amax != nullptr;

  const bool sixteen_bit = src.dtype() == DType::kBF16 || src.dtype() == DType::kF16;
  float amax = 0.0f;
  if (src.dtype() == DType::kF32) {
    amax =
        narrow_from_f32(src.data_as<const float>(), dst.data(), dst.dtype(), src.numel(), options);
  } else if (sixteen_bit && !options.stochastic) {
    amax =
        narrow_from_16bit(src.data(), src.dtype(), dst.data(), dst.dtype(), src.numel(), options);
  } else {
    amax = cast_through_f32(src, dst, options);
  }
  if (params.amax != nullptr) {
    float& out = params.amax->data_as<float>()[0];
    out = params.accumulate_amax ? larger_amax(out, amax) : amax;
  }
}

void CpuBackend::amax(const Tensor& x, Tensor& out) {
  check_amax(x, out, device());
  const int64_t n = x.numel();
  float result = 0.0f;
  switch (x.dtype()) {
    case DType::kF32: result = amax_of(x.data_as<const float>(), n); break;
    case DType::kBF16: result = amax_of(x.data_as<const bf16>(), n); break;
    case DType::kF16: result = amax_of(x.data_as<const fp16>(), n); break;
    case DType::kE4M3: result = amax_of(x.data_as<const fp8_e4m3>(), n); break;
    case DType::kE5M2: result = amax_of(x.data_as<const fp8_e5m2>(), n); break;
    default: MANTISSA_FAIL("amax: unreachable dtype " << dtype_name(x.dtype()));
  }
  out.data_as<float>()[0] = result;
}

// x[N, C] (F32, BF16 or F16) += bias[C] (any of those), one rounding per element.
void CpuBackend::add_bias(Tensor& x, const Tensor& bias) {
  check_add_bias(x, bias, device());
  // The bias is a compute copy in any float dtype; widen it once.
  std::vector<float> bias_f32(static_cast<size_t>(bias.numel()));
  widen_to_f32(bias.data(), bias.dtype(), bias_f32.data(), bias.numel());
  with_activation_type(
      x, [&](auto* data) { add_bias_rows(data, bias_f32.data(), x.dim(0), x.dim(1)); });
}

// dbias[C] (F32) += column sums of dout[N, C] (F32, BF16 or F16), FP32 accumulation,
// deterministic for any thread count.
void CpuBackend::bias_backward(const Tensor& dout, Tensor& dbias) {
  check_bias_backward(dout, dbias, device());
  with_activation_type(dout, [&](auto* data) {
    add_column_sums(data, dbias.data_as<float>(), dout.dim(0), dout.dim(1));
  });
}

// out = a + b, all three of one dtype (F32, BF16 or F16) and shape; out may alias a or b.
void CpuBackend::add(const Tensor& a, const Tensor& b, Tensor& out) {
  check_add(a, b, out, device());
  with_activation_type(out, [&](auto* data) {
    using T = std::remove_pointer_t<decltype(data)>;
    add_elements(a.data_as<const T>(), b.data_as<const T>(), data, a.numel());
  });
}

// out = gelu(x), x and out of one dtype (F32, BF16 or F16) and shape.
void CpuBackend::gelu_forward(const Tensor& x, Tensor& out) {
  check_gelu_forward(x, out, device());
  with_activation_type(out, [&](auto* data) {
    using T = std::remove_pointer_t<decltype(data)>;
    gelu_forward_elements(x.data_as<const T>(), data, x.numel());
  });
}

// dx = dout * gelu'(x), all three of one dtype (F32, BF16 or F16) and shape; dx may alias dout.
void CpuBackend::gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) {
  check_gelu_backward(x, dout, dx, device());
  with_activation_type(dx, [&](auto* data) {
    using T = std::remove_pointer_t<decltype(data)>;
    gelu_backward_elements(x.data_as<const T>(), dout.data_as<const T>(), data, x.numel());
  });
}

}  // namespace mantissa::core
