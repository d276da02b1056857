// CpuBackend::gemm: C = alpha * op(A) op(B) + beta * C on the CPU.
//
// The numerics are cuBLASLt's with CUBLAS_COMPUTE_32F: exact products summed in FP32.
//  - BF16 and FP8 operands (every FP8 value is a BF16 value), on CPUs with AVX512-BF16: the
//    native BF16 kernel of cpu_gemm_bf16.cpp, on AMX tiles where the CPU has them (5.2-5.3x
//    sgemm on a Sapphire Rapids), else on VDPBF16PS (its speed follows the CPU's rate for that
//    instruction: 0.68x sgemm on a Sapphire Rapids).
//  - Other BF16, F16 and FP8 operands (and all of them with MANTISSA_CPU_BF16_GEMM=0): the
//    AVX2/FMA kernel of cpu_gemm_avx2.cpp, which widens them to FP32 (exactly: every BF16,
//    F16 and FP8 value is an FP32 value) while it packs cache-sized blocks of them, so no
//    widened copy of a whole operand is ever written.
//  - FP32 operands: OpenBLAS's cblas_sgemm, on the operands in place.
// The FP8 dequantize scales are folded into alpha, since (a sa)(b sb) summed over k equals
// sa sb (a b summed over k): like cuBLASLt's A/B scale pointers they are applied once to the
// accumulated sum, not to every operand element. An F32 output is written by the kernel
// directly, and so is a BF16 output of the native and the AVX2 kernel (rounded to nearest
// even as it is stored). Any other F16 or FP8 output is computed into an FP32 scratch buffer
// and rounded once, to nearest even (FP8 saturating to the largest finite value), with the quantize
// scale c_scale applied and amax taken before it.
//
// BLAS conventions hold: with beta = 0 the old C is never read (garbage or NaN there is
// simply overwritten), and with alpha = 0 the values of A and B do not matter (the AVX2
// kernel takes that case, and ignores them).
// fast_accumulate has no meaning here: the CPU always accumulates in full FP32.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <numeric>

#include "core/ops/cpu/cpu_backend.h"
#include "core/ops/cpu/cpu_convert.h"
#include "core/ops/cpu/cpu_gemm_avx2.h"
#include "core/ops/cpu/cpu_gemm_bf16.h"
#include "core/ops/cpu/cpu_gemm_scaled.h"
#include "core/ops/cpu/scratch_buffer.h"
#include "core/ops/gemm_checks.h"

namespace mantissa::core {
namespace {

// Slices of a product are at least this many rows (or columns) of C.
constexpr int64_t kMinSlice = 32;

float scale_value(const Tensor* scale) {
  return scale == nullptr ? 1.0f : *scale->data_as<const float>();
}

// Row-major sgemm on FP32 operands, `s.batch` independent products, spread over the OpenMP
// threads in slices: whole products when there are at least as many as threads, else blocks
// of rows of C, one cblas_sgemm per slice. Rows are preferred because a row block of C is
// contiguous, and on the model's shapes row slices ran 5-15% faster than column slices;
// columns are cut only when C has too few rows to go round. K is never split, so slicing
// adds no roundings: each element is still one sum over all of K.
//
// Why not OpenBLAS's own threads: the rest of the CPU backend runs on OpenMP's pool, and
// OpenBLAS (the pthreads build) brings a second one. Each pool keeps spinning for a while
// after its work ends, so on every switch between an OpenMP op and a GEMM the idle pool
// competes with the busy one for the cores. One pool avoids that, and OMP_NUM_THREADS alone
// then governs the backend (e.g. one thread per rank under mpirun).
void sliced_sgemm(const GemmShape& s, bool trans_a, bool trans_b, float alpha, const float* a,
                  const float* b, float beta, float* c) {
  // The setting is global to the process, so re-assert it in case someone changed it.
  if (openblas_get_num_threads() != 1) openblas_set_num_threads(1);
  const int64_t threads = omp_get_max_threads();
  const double flops = 2.0 * static_cast<double>(s.batch * s.m) * static_cast<double>(s.n * s.k);
  const bool parallel = threads > 1 && flops >= kGemmParallelFlops;
  // Slices per product: enough that the slice count is a multiple of the thread count (so
  // every thread gets the same work), but none thinner than kMinSlice rows or columns.
  const bool by_rows = s.m >= threads * kMinSlice || s.m >= s.n;
  const int64_t extent = by_rows ? s.m : s.n;
  const int64_t parts = parallel ? std::clamp<int64_t>(threads / std::gcd(s.batch, threads), 1,
                                                       std::max<int64_t>(1, extent / kMinSlice))
                                 : 1;
  // Row-major leading dimensions are the stored row lengths; BLAS wants them >= 1 even for
  // empty matrices.
  const int lda = static_cast<int>(std::max<int64_t>(1, trans_a ? s.m : s.k));
  const int ldb = static_cast<int>(std::max<int64_t>(1, trans_b ? s.k : s.n));
  const int ldc = static_cast<int>(std::max<int64_t>(1, s.n));
  const int64_t slices = s.batch * parts;
#pragma omp parallel for schedule(static) if (parallel && slices > 1)
  for (int64_t slice = 0; slice < slices; ++slice) {
    const int64_t batch = slice / parts;
    const int64_t part = slice % parts;
    const int64_t lo = extent * part / parts;
    const int64_t hi = extent * (part + 1) / parts;
    const float* a_batch = a + batch * s.m * s.k;
    const float* b_batch = b + batch * s.k * s.n;
    float* c_batch = c + batch * s.m * s.n;
    // Rows [lo, hi) of C need rows [lo, hi) of op(A): rows of A, or columns of a transposed
    // A. Columns [lo, hi) of C need columns [lo, hi) of op(B): columns of B, or rows of a
    // transposed B.
    const float* a_slice = a_batch + (by_rows ? (trans_a ? lo : lo * s.k) : 0);
    const float* b_slice = b_batch + (by_rows ? 0 : (trans_b ? lo * s.k : lo));
    float* c_slice = c_batch + (by_rows ? lo * s.n : lo);
    const int64_t m = by_rows ? hi - lo : s.m;
    const int64_t n = by_rows ? s.n : hi - lo;
    cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
                trans_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
                static_cast<int>(s.k), alpha, a_slice, lda, b_slice, ldb, beta, c_slice, ldc);
  }
}

}  // namespace

void CpuBackend::gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmParams& p) {
  const GemmShape s = check_gemm(a, b, c, p, device());
  if (p.a_scale_mode != ScaleMode::kTensor) {  // block-scaled FP8: cpu_gemm_scaled.cpp
    gemm_block_scaled(s, a, b, c, p);
    return;
  }

  const float alpha = p.alpha * scale_value(p.a_scale) * scale_value(p.b_scale);
  const bool native_bf16 =
      alpha != 0.0f && bf16_gemm_enabled() && bf16_gemm_supports(a.dtype(), b.dtype());
  // OpenBLAS reads A and B at alpha = 0 in some of its kernels, so a NaN there reached C
  // depending on the shape and the thread count; the AVX2 kernel never reads them then.
  const bool sgemm = !native_bf16 && a.dtype() == DType::kF32 && alpha != 0.0f;
  // The native BF16 kernel and the AVX2 kernel write an FP32 or BF16 C themselves, rounding
  // as they store.
  if (!sgemm && (c.dtype() == DType::kF32 || c.dtype() == DType::kBF16)) {
    if (native_bf16) {
      gemm_bf16(s, a, p.trans_a, b, p.trans_b, alpha, p.beta, c.data(), c.dtype());
    } else {
      gemm_avx2(s, a, p.trans_a, b, p.trans_b, alpha, p.beta, c.data(), c.dtype());
    }
    return;
  }

  thread_local ScratchBuffer<float> c_wide;
  const bool direct = c.dtype() == DType::kF32;
  float* c32 = direct ? c.data_as<float>() : c_wide.get(c.numel());
  // beta * C needs the old C in FP32 (BF16 and F16 widen exactly); with beta = 0 no kernel
  // reads C at all.
  if (!direct && p.beta != 0.0f) widen_to_f32(c.data(), c.dtype(), c32, c.numel());

  if (native_bf16) {
    gemm_bf16(s, a, p.trans_a, b, p.trans_b, alpha, p.beta, c32);
  } else if (sgemm) {
    sliced_sgemm(s, p.trans_a, p.trans_b, alpha, a.data_as<const float>(), b.data_as<const float>(),
                 p.beta, c32);
  } else {
    gemm_avx2(s, a, p.trans_a, b, p.trans_b, alpha, p.beta, c32, DType::kF32);
  }
  if (direct) return;

  NarrowOptions narrow;
  narrow.scale = scale_value(p.c_scale);
  narrow.want_amax = p.c_amax != nullptr;
  const float amax = narrow_from_f32(c32, c.data(), c.dtype(), c.numel(), narrow);
  if (p.c_amax != nullptr) *p.c_amax->data_as<float>() = amax;
}

}  // namespace mantissa::core
