// AdamW, sums of squares (for the global gradient norm) and the fused unscale + non-finite
// check on the CPU.
//
// The reductions here are deterministic for any number of OpenMP threads: the work is cut
// into fixed blocks whose size does not depend on the thread count, and the per-block results
// are combined in block order (sum_squares) or with an order-free operation (the minimum
// index in unscale_check_finite). Runs with different thread counts therefore agree bit for
// bit, which the cross-rank consistency checks rely on.
#include <algorithm>
#include <span>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/math/adamw_update.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

// Below this many elements a parallel region costs more than it saves.
constexpr int64_t kParallelMin = 1 << 15;

// Elements per block of the blocked reductions (sum_squares, unscale_check_finite).
constexpr int64_t kReduceBlock = 4096;

// ---------------------------------------------------------------------------------------
// AdamW

// Stands for "no compute copy" in adamw_elements.
struct NoCopy {};

// adamw_update (core/ops/math/adamw_update.h, shared with the CUDA backend) for every
// element. When C is a storage type, the updated parameter is also rounded (to nearest even)
// into copy[i], saving a second pass over the parameters to produce the compute copy.
//
// (GCC vectorises this loop only with -fno-math-errno: otherwise sqrt keeps a scalar path
// that sets errno for negative inputs. The flag changes no result.)
template <class G, class C>
void adamw_elements(float* param, const G* grad, float* m, float* v, C* copy, int64_t n,
                    const AdamWCoefficients k) {
#pragma omp parallel for simd schedule(static) if (n > kParallelMin)
  for (int64_t i = 0; i < n; ++i) {
    const float p = adamw_update(param[i], to_float(grad[i]), m[i], v[i], k);
    param[i] = p;
    if constexpr (!std::is_same_v<C, NoCopy>) copy[i] = round_to<C>(p);
  }
}

// adamw_elements over each range, with the weight decay where the range says so.
template <class G, class C>
void adamw_ranges(float* param, const G* grad, float* m, float* v, C* copy,
                  std::span<const ParamRange> ranges, const AdamWCoefficients& k) {
  for (const ParamRange& r : ranges) {
    AdamWCoefficients range_k = k;
    if (!r.weight_decay) range_k.weight_decay = 0.0f;
    C* range_copy = nullptr;
    if constexpr (!std::is_same_v<C, NoCopy>) range_copy = copy + r.offset;
    adamw_elements(param + r.offset, grad + r.offset, m + r.offset, v + r.offset, range_copy,
                   r.numel, range_k);
  }
}

template <class G>
void adamw_with_grad_type(float* param, const G* grad, float* m, float* v, Tensor* copy,
                          std::span<const ParamRange> ranges, const AdamWCoefficients& k) {
  if (copy == nullptr) {
    adamw_ranges(param, grad, m, v, static_cast<NoCopy*>(nullptr), ranges, k);
    return;
  }
  switch (copy->dtype()) {
    case DType::kF32: return adamw_ranges(param, grad, m, v, copy->data_as<float>(), ranges, k);
    case DType::kBF16: return adamw_ranges(param, grad, m, v, copy->data_as<bf16>(), ranges, k);
    case DType::kF16: return adamw_ranges(param, grad, m, v, copy->data_as<fp16>(), ranges, k);
    default: MANTISSA_FAIL("adamw: unreachable compute_copy dtype " << dtype_name(copy->dtype()));
  }
}

// ---------------------------------------------------------------------------------------
// sum_squares

// sum x^2 over fixed blocks, each accumulated in FP64 (where the square of an FP32 value is
// exact), then the block sums added in block order. The result depends only on the data,
// never on the thread count.
template <class T>
double sum_of_squares(const T* x, int64_t n) {
  const int64_t n_blocks = (n + kReduceBlock - 1) / kReduceBlock;
  std::vector<double> block_sum(static_cast<size_t>(n_blocks));
#pragma omp parallel for schedule(static) if (n > kParallelMin)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t end = std::min(n, (b + 1) * kReduceBlock);
    double s = 0.0;
#pragma omp simd reduction(+ : s)
    for (int64_t i = b * kReduceBlock; i < end; ++i) {
      const double xi = to_float(x[i]);
      s += xi * xi;
    }
    block_sum[b] = s;
  }
  double total = 0.0;
  for (double s : block_sum) total += s;
  return total;
}

// ---------------------------------------------------------------------------------------
// unscale_check_finite

// 1 for inf or NaN, else 0: summed over a run, branch free.
inline uint32_t is_nonfinite(float x) {
  return is_nonfinite_bits(x) ? 1u : 0u;
}

// Scales x in place and returns the smallest index of an element that was non-finite before
// scaling, or n when there is none. Each block is first tested (a vectorised OR) and scanned
// for its first bad element only when the test fires, then scaled. Taking the minimum of the
// per-block answers is independent of the order the blocks finish in.
template <class T>
int64_t unscale_elements(T* x, int64_t n, float inv_scale) {
  const int64_t n_blocks = (n + kReduceBlock - 1) / kReduceBlock;
  int64_t first = n;
#pragma omp parallel for schedule(static) reduction(min : first) if (n > kParallelMin)
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t begin = b * kReduceBlock;
    const int64_t end = std::min(n, begin + kReduceBlock);
    uint32_t any_bad = 0;
#pragma omp simd reduction(| : any_bad)
    for (int64_t i = begin; i < end; ++i) any_bad |= is_nonfinite(to_float(x[i]));
    if (any_bad != 0) {
      int64_t i = begin;
      while (is_nonfinite(to_float(x[i])) == 0) ++i;
      first = std::min(first, i);
    }
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) x[i] = round_to<T>(to_float(x[i]) * inv_scale);
  }
  return first;
}

}  // namespace

// AdamW on F32 params, m, v of one shape; grads F32 or BF16 of that shape. compute_copy, when
// given, is F32, BF16 or F16 (FP8 compute copies need a scale and are made with cast()).
void CpuBackend::adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                       Tensor* compute_copy, std::span<const ParamRange> ranges,
                       const AdamWParams& p) {
  check_adamw(params, grads, m, v, compute_copy, ranges, p, device());
  const AdamWCoefficients k = adamw_coefficients(p);
  if (grads.dtype() == DType::kF32) {
    adamw_with_grad_type(params.data_as<float>(), grads.data_as<const float>(), m.data_as<float>(),
                         v.data_as<float>(), compute_copy, ranges, k);
  } else {
    adamw_with_grad_type(params.data_as<float>(), grads.data_as<const bf16>(), m.data_as<float>(),
                         v.data_as<float>(), compute_copy, ranges, k);
  }
}

// out (F32 scalar) += sum x^2 for x F32, BF16 or F16, accumulated in FP64 and rounded once.
// Deterministic for any thread count.
void CpuBackend::sum_squares(const Tensor& x, Tensor& out) {
  check_sum_squares(x, out, device());
  const int64_t n = x.numel();
  double total = 0.0;
  switch (x.dtype()) {
    case DType::kF32: total = sum_of_squares(x.data_as<const float>(), n); break;
    case DType::kBF16: total = sum_of_squares(x.data_as<const bf16>(), n); break;
    case DType::kF16: total = sum_of_squares(x.data_as<const fp16>(), n); break;
    default: MANTISSA_FAIL("sum_squares: unreachable dtype " << dtype_name(x.dtype()));
  }
  float& acc = out.data_as<float>()[0];
  acc = static_cast<float>(static_cast<double>(acc) + total);
}

// x (F32, BF16 or F16) *= inv_scale in place. Finiteness is judged on the values before
// scaling: found (F32 scalar) becomes 1 when any element is inf or NaN and is otherwise left
// as it was; first_index (I64 scalar), when given, is overwritten with the smallest such
// index or -1. A finite element that overflows only because inv_scale > 1 is not reported.
void CpuBackend::unscale_check_finite(Tensor& x, float inv_scale, Tensor& found,
                                      Tensor* first_index) {
  check_unscale_check_finite(x, inv_scale, found, first_index, device());
  const int64_t n = x.numel();
  int64_t first = n;
  switch (x.dtype()) {
    case DType::kF32: first = unscale_elements(x.data_as<float>(), n, inv_scale); break;
    case DType::kBF16: first = unscale_elements(x.data_as<bf16>(), n, inv_scale); break;
    case DType::kF16: first = unscale_elements(x.data_as<fp16>(), n, inv_scale); break;
    default: MANTISSA_FAIL("unscale_check_finite: unreachable dtype " << dtype_name(x.dtype()));
  }
  if (first < n) found.data_as<float>()[0] = 1.0f;
  if (first_index != nullptr) first_index->data_as<int64_t>()[0] = first < n ? first : -1;
}

}  // namespace mantissa::core
