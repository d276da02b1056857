// The vector kernels of CpuBackend::quantize_blocks (cpu_quantize_blocks.cpp): a block's amax,
// its scale, and its codes round(x / s) computed in registers -- the source widened as it is
// loaded, divided, rounded to FP8 (fp8_round8, or fp8_round16 in the AVX-512 versions of
// cpu_quantize_runs_avx512.cpp that run where avx512::narrow_enabled()) and stored as bytes,
// with no FP32 copy. Rows of finite blocks divide |x| and round the quotient as a magnitude
// (fp8_code_of_magnitude8/16), then put x's sign on the code: the same codes in fewer steps.
//
// Every code equals block_scaling.h's quantize_with_scale<Code>(x, s), i.e. the FP8 rounding
// of the correctly rounded FP32 quotient divide_rn(x, s). The kernels reach that quotient in
// one of three ways, chosen per scale by make_divisor (test_cpu_quantize_runs.cpp compares
// them with divide_rn exhaustively over the BF16 inputs, and over every FP32 input for some
// scales):
//  - kMultiply: s a power of two in [2^-127, 2^127], whose reciprocal r = 1/s is exact:
//    x * r is the exact x / s, or, below the normal range, that same exact value rounded once.
//  - kReciprocalFma: s not a power of two, 2^-60 <= s < 2^125: Markstein's correction of the
//    product by the correctly rounded reciprocal r = RN(1/s): q0 = RN(x r), e = x - q0 s
//    (exact in one FMA, since q0 is within an ulp of x / s and e stays in the normal range
//    wherever the code can be non-zero), q = RN(q0 + e r) is the correctly rounded quotient.
//    x = -0 would give +0; the quotient takes x's sign, which it always has. It needs a
//    finite x with |x| / s far inside FP32's range (the tests take |x| <= 2^64 s), which
//    quantize_blocks guarantees: |x| <= amax <= s fmt_max (1 + 2^-23), and the blocks that
//    hold inf or NaN have s = 1 and multiply (or divide, where their lanes share a vector
//    with other blocks'). A power-of-two s on this path gives its exact quotient too.
//  - kDivide: any other scale (s below 2^-60 or the powers of two below 2^-127, which only
//    tiny blocks take): the division instruction itself.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "core/dtype/dtype.h"
#include "core/tensor/tensor.h"

namespace mantissa::core::quantize_runs {

enum class Division : uint8_t { kMultiply, kReciprocalFma, kDivide };

struct Divisor {
  float s = 1.0f;
  float r = 1.0f;  // RN(1 / s) for kMultiply and kReciprocalFma
  Division how = Division::kMultiply;
  bool finite = true;  // the block's amax is finite: no lane is inf or NaN
};

Divisor make_divisor(float s);

// The scales of n blocks from their amax patterns (as block_amax gives them), exactly
// block_scale(amax, fmt_max, power_of_two) -- or, with `mx`, e8m0_to_float of
// mx_scale_e8m0(amax, fmt_max), whose exponents go to e8m0[i] -- and their divisors. Eight
// blocks per vector; the rare lanes whose quotient amax / fmt_max is subnormal take the
// scalar function. d[i].finite says whether amax[i] is finite.
void block_scales(const uint32_t* amax, int64_t n, float fmt_max, bool power_of_two, bool mx,
                  float* s, uint8_t* e8m0, Divisor* d);

// amax[j] = the largest bit pattern of |x[i]| as FP32 over block j of a row of k elements cut
// into blocks of block_k (above 0x7F800000 when the block holds a NaN): the amax that
// block_scale takes, as bits.
void block_amax(const float* x, int64_t k, int64_t block_k, uint32_t* amax);
void block_amax(const bf16* x, int64_t k, int64_t block_k, uint32_t* amax);
void block_amax(const fp16* x, int64_t k, int64_t block_k, uint32_t* amax);

// A row of k elements cut into blocks of block_k (a power of two >= 16, or >= k): out[j] =
// quantize_with_scale<code>(x[j], d[j / block_k].s).bits, code E4M3 or E5M2; the blocks whose
// d.finite is set hold finite x only (their NaN test is left out). One call per row saves the
// per-block setup that dominates blocks of 32 and 128. `next`, unless null, is where the next
// call reads (k elements): it is asked into L1 while this row is quantised, so that the next
// row's amax pass, which reads it first, finds it there instead of waiting on memory.
void quantize_row(const float* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const float* next);
void quantize_row(const bf16* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const bf16* next);
void quantize_row(const fp16* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const fp16* next);

// The one method a row's kernel runs for all its blocks (the kernels are specialised per
// method): multiplication when every block allows it (skipping the NaN test when every block is
// finite), else the FMA quotient (exact for powers of two too, on finite x), else -- a block
// with a tiny scale, or with inf or NaN (whose s = 1 multiplies, but not through the FMA) -- the
// division instruction.
enum class RowMethod : uint8_t { kMultiplyFinite, kMultiply, kReciprocalFma, kDivide };
RowMethod row_method(const Divisor* d, int64_t k, int64_t block_k);

// Calls kernel.template operator()<How, kNaN>() with the division and NaN test that `method`
// stands for: the one mapping that both kernel files' row kernels are instantiated through.
template <class Kernel>
void with_row_method(RowMethod method, const Kernel& kernel) {
  switch (method) {
    case RowMethod::kMultiplyFinite:
      return kernel.template operator()<Division::kMultiply, false>();
    case RowMethod::kMultiply: return kernel.template operator()<Division::kMultiply, true>();
    case RowMethod::kReciprocalFma:
      return kernel.template operator()<Division::kReciprocalFma, false>();
    case RowMethod::kDivide: return kernel.template operator()<Division::kDivide, true>();
  }
}

// Column kernels for a transposed source, whose operand rows are its columns: kColumns
// adjacent columns are the vector lanes, and each source row is read contiguously.
inline constexpr int64_t kColumns = 32;

// amax[c] = the amax pattern (as block_amax) of column c over rows [0, rows): x[r * stride + c].
void amax_columns(const float* x, int64_t stride, int64_t rows, uint32_t amax[kColumns]);
void amax_columns(const bf16* x, int64_t stride, int64_t rows, uint32_t amax[kColumns]);
void amax_columns(const fp16* x, int64_t stride, int64_t rows, uint32_t amax[kColumns]);

// out[r * kColumns + c] = quantize_with_scale<code>(x[r * stride + c], d[c].s).bits. Lanes
// whose scale is not kDivide use the reciprocal and FMA, which is exact for a power of two too,
// except on an infinite x; `any_infinite` (some column holds inf) makes every lane divide.
// `next`, unless null, is where the next call reads (the same stride and rows): row r of it is
// asked into L2 while row r here is quantised, because source rows this far apart sit on
// different pages, where the hardware prefetchers stop.
void quantize_columns(const float* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool any_infinite, DType code, uint8_t* out, const float* next);
void quantize_columns(const bf16* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool any_infinite, DType code, uint8_t* out, const bf16* next);
void quantize_columns(const fp16* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool any_infinite, DType code, uint8_t* out, const fp16* next);

// Asks for the lines of [p, p + bytes) to be brought into L2.
inline void prefetch_l2(const void* p, int64_t bytes) {
  const auto* first = static_cast<const char*>(p);
  for (int64_t at = 0; at < bytes; at += 64) _mm_prefetch(first + at, _MM_HINT_T1);
  if (bytes > 0) _mm_prefetch(first + bytes - 1, _MM_HINT_T1);
}

// dst[c * dst_stride + r] = src[r * src_stride + c] for r, c in [0, 16): a 16x16 byte block.
void transpose16x16(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride);

}  // namespace mantissa::core::quantize_runs
