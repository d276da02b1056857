// The code kernels of cpu_quantize_runs.h in AVX-512: the same quotients (divide16 mirrors
// cpu_quantize_runs.cpp's divide8) and cpu_fp8_round16.h's rounding, sixteen lanes at a time;
// a run's last n % 16 elements go under a mask, so there is no scalar tail. Only the code
// between the push_options and pop_options pragmas is compiled for AVX-512 (see
// cpu_narrow_avx512.cpp).
#include "core/ops/cpu/cpu_quantize_runs_avx512.h"

#include <immintrin.h>

#include <bit>

#include "core/ops/cpu/narrow_formats.h"

namespace mantissa::core::quantize_runs::avx512 {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
// GCC 12's masked-load intrinsics trip -Wuninitialized (GCC bug 105593), as in
// cpu_narrow_avx512.cpp.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

}  // namespace mantissa::core::quantize_runs::avx512

#include "core/ops/cpu/cpu_decode16.h"
#include "core/ops/cpu/cpu_fp8_round16.h"

namespace mantissa::core::quantize_runs::avx512 {
namespace {

using core::avx512::decode16;
using core::avx512::fp8_round16;

// x / s for a magnitude x >= 0 by the multiply or FMA method: divide16 less its sign fix, which
// such a quotient does not need (it is never -0).
template <Division How>
__m512 divide_magnitude16(__m512 x, __m512 s, __m512 r) {
  static_assert(How != Division::kDivide);
  const __m512 q0 = _mm512_mul_ps(x, r);
  if constexpr (How == Division::kMultiply) return q0;
  return _mm512_fmadd_ps(_mm512_fnmadd_ps(q0, s, x), r, q0);
}

template <Division How>
__m512 divide16(__m512 x, __m512 s, __m512 r) {
  if constexpr (How == Division::kDivide) {
    return _mm512_div_ps(x, s);
  } else if constexpr (How == Division::kMultiply) {
    return divide_magnitude16<How>(x, s, r);
  } else {
    // q | (x & sign): ternary-logic truth table A | (B & C).
    return _mm512_castsi512_ps(
        _mm512_ternarylogic_epi32(_mm512_castps_si512(divide_magnitude16<How>(x, s, r)),
                                  _mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN), 0xF8));
  }
}

// The code of x / s for a finite x by the multiply or FMA method, as fp8_round16 of divide16's
// quotient with kSatFinite: the quotient of |x|, rounded as a magnitude, with x's sign.
template <SmallFloatFormat F, Division How>
__m512i finite_code16(__m512 x, __m512 s, __m512 r) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512 magnitude =
      _mm512_castsi512_ps(_mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF)));
  return core::avx512::fp8_signed_code16<F>(
      _mm512_castps_si512(divide_magnitude16<How>(magnitude, s, r)), F.max_finite_code, bits);
}

// 64 codes from four vectors: packs narrow the lanes and interleave the 128-bit quarters,
// which one permute puts back in order.
void store64(uint8_t* dst, const __m512i c[4]) {
  const __m512i packed =
      _mm512_packus_epi16(_mm512_packus_epi32(c[0], c[1]), _mm512_packus_epi32(c[2], c[3]));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi32(order, packed));
}

// quantize_row with every block on the method How. Each vector of sixteen lies in one block
// (block_k is a power of two of at least 16, or the whole row), whose s and r it broadcasts.
template <class Src, class Code, Division How, bool kNaN>
void row(const Src* x, int64_t k, int64_t block_k, const Divisor* d, uint8_t* out,
         const Src* next) {
  constexpr SmallFloatFormat F = Fp8Format<Code>::value;
  // i / block_k as a shift (block_k a power of two; a single block shifts everything out).
  const int shift = block_k >= k ? 63 : std::countr_zero(static_cast<uint64_t>(block_k));
  const auto block_of = [=](int64_t i) { return i >> shift; };
  const auto codes16 = [&](int64_t i, __mmask16 lanes) {
    const Divisor& e = d[block_of(i)];
    const __m512 v = decode16(x + i, lanes), s = _mm512_set1_ps(e.s), r = _mm512_set1_ps(e.r);
    if constexpr (How == Division::kDivide || kNaN) {
      return fp8_round16<F, kNaN>(divide16<How>(v, s, r), Saturation::kSatFinite);
    } else {
      return finite_code16<F, How>(v, s, r);
    }
  };
  int64_t i = 0;
  for (; i + 64 <= k; i += 64) {
    if (next != nullptr) {
      for (size_t line = 0; line < 64 * sizeof(Src); line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(next + i) + line, _MM_HINT_T0);
      }
    }
    const __m512i c[4] = {codes16(i, 0xFFFF), codes16(i + 16, 0xFFFF), codes16(i + 32, 0xFFFF),
                          codes16(i + 48, 0xFFFF)};
    store64(out + i, c);
  }
  for (; i < k; i += 16) {
    const __mmask16 lanes = k - i >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << (k - i)) - 1);
    _mm512_mask_cvtepi32_storeu_epi8(out + i, lanes, codes16(i, lanes));
  }
}

// The row in the method row_method chooses for it.
template <class Src, class Code>
void row_any_method(const Src* x, int64_t k, int64_t block_k, const Divisor* d, uint8_t* out,
                    const Src* next) {
  with_row_method(row_method(d, k, block_k), [&]<Division How, bool kNaN>() {
    row<Src, Code, How, kNaN>(x, k, block_k, d, out, next);
  });
}

template <class Src>
void row_any(const Src* x, int64_t k, int64_t block_k, const Divisor* d, DType code, uint8_t* out,
             const Src* next) {
  if (code == DType::kE4M3) return row_any_method<Src, fp8_e4m3>(x, k, block_k, d, out, next);
  row_any_method<Src, fp8_e5m2>(x, k, block_k, d, out, next);
}

template <class Src, class Code, Division How>
void columns(const Src* x, int64_t stride, int64_t rows, const Divisor d[kColumns], uint8_t* out,
             const Src* next) {
  static_assert(kColumns == 32, "two vectors of sixteen lanes per row");
  constexpr SmallFloatFormat F = Fp8Format<Code>::value;
  alignas(64) float s_lanes[kColumns], r_lanes[kColumns];
  for (int64_t c = 0; c < kColumns; ++c) {
    s_lanes[c] = d[c].s;
    r_lanes[c] = d[c].r;
  }
  const __m512 s0 = _mm512_load_ps(s_lanes), s1 = _mm512_load_ps(s_lanes + 16);
  const __m512 r0 = _mm512_load_ps(r_lanes), r1 = _mm512_load_ps(r_lanes + 16);
  for (int64_t row = 0; row < rows; ++row) {
    if (next != nullptr) prefetch_l2(next + row * stride, kColumns * sizeof(Src));
    const Src* p = x + row * stride;
    const __m512i c0 =
        fp8_round16<F>(divide16<How>(decode16(p, 0xFFFF), s0, r0), Saturation::kSatFinite);
    const __m512i c1 =
        fp8_round16<F>(divide16<How>(decode16(p + 16, 0xFFFF), s1, r1), Saturation::kSatFinite);
    const __m256i bytes = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm512_cvtepi32_epi8(c0)),
                                                  _mm512_cvtepi32_epi8(c1), 1);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + row * kColumns), bytes);
  }
}

template <class Src>
void columns_any(const Src* x, int64_t stride, int64_t rows, const Divisor d[kColumns], bool divide,
                 DType code, uint8_t* out, const Src* next) {
  if (code == DType::kE4M3) {
    if (divide) return columns<Src, fp8_e4m3, Division::kDivide>(x, stride, rows, d, out, next);
    return columns<Src, fp8_e4m3, Division::kReciprocalFma>(x, stride, rows, d, out, next);
  }
  if (divide) return columns<Src, fp8_e5m2, Division::kDivide>(x, stride, rows, d, out, next);
  return columns<Src, fp8_e5m2, Division::kReciprocalFma>(x, stride, rows, d, out, next);
}

}  // namespace

void quantize_row(const float* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const float* next) {
  row_any(x, k, block_k, d, code, out, next);
}
void quantize_row(const bf16* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const bf16* next) {
  row_any(x, k, block_k, d, code, out, next);
}
void quantize_row(const fp16* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const fp16* next) {
  row_any(x, k, block_k, d, code, out, next);
}

void quantize_columns(const float* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool divide, DType code, uint8_t* out, const float* next) {
  columns_any(x, stride, rows, d, divide, code, out, next);
}
void quantize_columns(const bf16* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool divide, DType code, uint8_t* out, const bf16* next) {
  columns_any(x, stride, rows, d, divide, code, out, next);
}
void quantize_columns(const fp16* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool divide, DType code, uint8_t* out, const fp16* next) {
  columns_any(x, stride, rows, d, divide, code, out, next);
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace mantissa::core::quantize_runs::avx512
