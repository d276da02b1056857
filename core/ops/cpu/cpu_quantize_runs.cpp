// AVX2 kernels of the fused block quantisation (cpu_quantize_runs.h says what each computes
// and why the quotients equal divide_rn). Eight lanes per vector, 32 codes per step so that
// they pack into one 32-byte store; the last few elements of a run use the scalar definitions.
#include "core/ops/cpu/cpu_quantize_runs.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>

#include "core/int_math.h"
#include "core/ops/cpu/cpu_convert8.h"
#include "core/ops/cpu/cpu_fp8_round8.h"
#include "core/ops/cpu/cpu_narrow_avx512.h"
#include "core/ops/cpu/cpu_quantize_runs_avx512.h"
#include "core/precision/block_scaling.h"

namespace mantissa::core::quantize_runs {
namespace {

constexpr uint32_t kTwoToMinus60 = (127u - 60u) << 23;
// Block scales stay below 2^119 (FLT_MAX / 448); above 2^125 the reciprocal would leave the
// normal range.
constexpr uint32_t kTwoTo125 = (127u + 125u) << 23;

// x / s for a magnitude x >= 0 by the multiply or FMA method: divide8 less its sign fix, which
// such a quotient does not need (it is never -0).
template <Division How>
__m256 divide_magnitude8(__m256 x, __m256 s, __m256 r) {
  static_assert(How != Division::kDivide);
  const __m256 q0 = _mm256_mul_ps(x, r);
  if constexpr (How == Division::kMultiply) return q0;
  return _mm256_fmadd_ps(_mm256_fnmadd_ps(q0, s, x), r, q0);
}

// x / s rounded to nearest as FP32, by the method `How` (see cpu_quantize_runs.h).
template <Division How>
__m256 divide8(__m256 x, __m256 s, __m256 r) {
  if constexpr (How == Division::kDivide) {
    return _mm256_div_ps(x, s);
  } else if constexpr (How == Division::kMultiply) {
    return divide_magnitude8<How>(x, s, r);
  } else {
    return _mm256_or_ps(divide_magnitude8<How>(x, s, r), _mm256_and_ps(x, _mm256_set1_ps(-0.0f)));
  }
}

// The code of x / s for a finite x by the multiply or FMA method, as fp8_round8 of divide8's
// quotient with kSatFinite: the quotient of |x|, rounded as a magnitude, with x's sign.
template <SmallFloatFormat F, Division How>
__m256i finite_code8(__m256 x, __m256 s, __m256 r) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256 magnitude =
      _mm256_castsi256_ps(_mm256_and_si256(bits, _mm256_set1_epi32(0x7FFFFFFF)));
  return fp8_signed_code8<F>(_mm256_castps_si256(divide_magnitude8<How>(magnitude, s, r)),
                             F.max_finite_code, bits);
}

template <class Code>
uint8_t scalar_code(float x, float s) {
  return quantize_with_scale<Code>(x, s).bits;
}

// The largest unsigned 16-bit lane.
uint32_t horizontal_max_u16(__m256i v) {
  const __m128i m = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  // minpos finds the smallest lane; of the complements that is the largest.
  const __m128i inverted = _mm_xor_si128(m, _mm_set1_epi32(-1));
  return 0xFFFFu & ~static_cast<uint32_t>(_mm_cvtsi128_si32(_mm_minpos_epu16(inverted)));
}

uint32_t horizontal_max_u32(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0b01001110));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0b10110001));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

// The FP32 amax pattern of a 16-bit magnitude pattern: BF16 is FP32's top half; FP16
// magnitudes order like their values (NaNs above inf) and widen exactly, NaN to a NaN.
uint32_t widened_bits(const bf16*, uint32_t magnitude) {
  return magnitude << 16;
}
uint32_t widened_bits(const fp16*, uint32_t magnitude) {
  return float_to_bits(to_float(fp16{static_cast<uint16_t>(magnitude)})) & 0x7FFFFFFFu;
}

// BF16 and FP16: the maximum of the 16-bit magnitude patterns, widened once.
template <class Src>
[[gnu::always_inline]] inline uint32_t amax_bits16(const Src* x, int64_t n) {
  const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const auto* p = reinterpret_cast<const __m256i*>(x + i);
    m0 = _mm256_max_epu16(m0, _mm256_and_si256(_mm256_loadu_si256(p), magnitude));
    m1 = _mm256_max_epu16(m1, _mm256_and_si256(_mm256_loadu_si256(p + 1), magnitude));
  }
  uint32_t m = horizontal_max_u16(_mm256_max_epu16(m0, m1));
  for (; i < n; ++i) m = std::max<uint32_t>(m, x[i].bits & 0x7FFFu);
  return widened_bits(x, m);
}

// Column lanes of one source row: kColumns values as four FP32 vectors.
template <class Src>
void decode32(const Src* x, __m256 v[4]) {
  for (int k = 0; k < 4; ++k) v[k] = decode8(x + 8 * k);
}

template <class Src, class Code, Division How>
void columns(const Src* x, int64_t stride, int64_t rows, const Divisor d[kColumns], uint8_t* out,
             const Src* next) {
  constexpr SmallFloatFormat F = Fp8Format<Code>::value;
  __m256 s[4], r[4];
  for (int k = 0; k < 4; ++k) {
    s[k] = _mm256_setr_ps(d[8 * k].s, d[8 * k + 1].s, d[8 * k + 2].s, d[8 * k + 3].s,
                          d[8 * k + 4].s, d[8 * k + 5].s, d[8 * k + 6].s, d[8 * k + 7].s);
    r[k] = _mm256_setr_ps(d[8 * k].r, d[8 * k + 1].r, d[8 * k + 2].r, d[8 * k + 3].r,
                          d[8 * k + 4].r, d[8 * k + 5].r, d[8 * k + 6].r, d[8 * k + 7].r);
  }
  for (int64_t row = 0; row < rows; ++row) {
    if (next != nullptr) prefetch_l2(next + row * stride, kColumns * sizeof(Src));
    __m256 v[4];
    decode32(x + row * stride, v);
    __m256i c[4];
    for (int k = 0; k < 4; ++k) {
      c[k] = fp8_round8<F>(divide8<How>(v[k], s[k], r[k]), Saturation::kSatFinite);
    }
    store32_u8(out + row * kColumns, c[0], c[1], c[2], c[3]);
  }
}

template <class Src>
void columns_any(const Src* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                 bool any_infinite, DType code, uint8_t* out, const Src* next) {
  const bool divide = any_infinite || std::any_of(d, d + kColumns, [](const Divisor& e) {
                        return e.how == Division::kDivide;
                      });
  if (core::avx512::narrow_enabled()) {
    return avx512::quantize_columns(x, stride, rows, d, divide, code, out, next);
  }
  if (code == DType::kE4M3) {
    if (divide) return columns<Src, fp8_e4m3, Division::kDivide>(x, stride, rows, d, out, next);
    return columns<Src, fp8_e4m3, Division::kReciprocalFma>(x, stride, rows, d, out, next);
  }
  if (divide) return columns<Src, fp8_e5m2, Division::kDivide>(x, stride, rows, d, out, next);
  return columns<Src, fp8_e5m2, Division::kReciprocalFma>(x, stride, rows, d, out, next);
}

template <class Src>
void amax_columns16(const Src* x, int64_t stride, int64_t rows, uint32_t amax[kColumns]) {
  const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  for (int64_t row = 0; row < rows; ++row) {
    const auto* p = reinterpret_cast<const __m256i*>(x + row * stride);
    m0 = _mm256_max_epu16(m0, _mm256_and_si256(_mm256_loadu_si256(p), magnitude));
    m1 = _mm256_max_epu16(m1, _mm256_and_si256(_mm256_loadu_si256(p + 1), magnitude));
  }
  alignas(32) uint16_t lanes[kColumns];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), m0);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 16), m1);
  for (int64_t c = 0; c < kColumns; ++c) amax[c] = widened_bits(x, lanes[c]);
}

}  // namespace

namespace {

// make_divisor for s and its reciprocal r = RN(1 / s).
Divisor divisor_with(float s, float r) {
  const uint32_t bits = float_to_bits(s);
  const bool power_of_two =
      bits >= 0x00800000u ? (bits & 0x007FFFFFu) == 0 : (bits & (bits - 1)) == 0;
  if (power_of_two && bits >= 0x00400000u && bits <= 0x7F000000u) {  // 2^-127 .. 2^127
    return {s, r, Division::kMultiply};
  }
  if (!power_of_two && bits >= kTwoToMinus60 && bits < kTwoTo125) {
    return {s, r, Division::kReciprocalFma};
  }
  return {s, 1.0f, Division::kDivide};
}

// The scalar definitions, for the lanes block_scales leaves to them and the last n % 8.
float scalar_scale(uint32_t amax, float fmt_max, bool power_of_two, bool mx, uint8_t* e8m0) {
  if (!mx) return block_scale(bits_to_float(amax), fmt_max, power_of_two);
  *e8m0 = mx_scale_e8m0(bits_to_float(amax), fmt_max);
  return e8m0_to_float(*e8m0);
}

}  // namespace

Divisor make_divisor(float s) {
  return divisor_with(s, 1.0f / s);
}

RowMethod row_method(const Divisor* d, int64_t k, int64_t block_k) {
  const int64_t blocks = block_k >= k ? 1 : ceil_div(k, block_k);
  bool multiply = true, divide = false, finite = true;
  for (int64_t b = 0; b < blocks; ++b) {
    multiply = multiply && d[b].how == Division::kMultiply;
    divide = divide || d[b].how == Division::kDivide;
    finite = finite && d[b].finite;
  }
  if (multiply) return finite ? RowMethod::kMultiplyFinite : RowMethod::kMultiply;
  return divide || !finite ? RowMethod::kDivide : RowMethod::kReciprocalFma;
}

// block_scale on eight lanes, step by step as the scalar function: s = amax / fmt_max (the
// division instruction is correctly rounded, as divide_rn); with power_of_two the next power
// of two at or above s (the mantissa cleared and the exponent raised when the mantissa is not
// zero), doubled when amax divided by it still exceeds fmt_max; 1 for zero and non-finite
// amax. MXFP8 then floors the exponent at 2^-127 (E8M0 0).
void block_scales(const uint32_t* amax, int64_t n, float fmt_max, bool power_of_two, bool mx,
                  float* s, uint8_t* e8m0, Divisor* d) {
  const auto broadcast = [](uint32_t v) { return _mm256_set1_epi32(static_cast<int>(v)); };
  const __m256 fm = _mm256_set1_ps(fmt_max);
  const __m256i one_bits = broadcast(0x3F800000u), min_normal = broadcast(0x00800000u);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256i abs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(amax + i));
    const __m256i special =
        _mm256_or_si256(_mm256_cmpeq_epi32(abs, _mm256_setzero_si256()),
                        _mm256_cmpgt_epi32(abs, broadcast(0x7F7FFFFFu)));  // abs <= 0x7FFFFFFF
    const __m256 a = _mm256_castsi256_ps(abs);
    __m256i bits = _mm256_castps_si256(_mm256_div_ps(a, fm));
    const __m256i subnormal = _mm256_andnot_si256(special, _mm256_cmpgt_epi32(min_normal, bits));
    if (power_of_two || mx) {
      const __m256i mantissa = _mm256_and_si256(bits, broadcast(0x007FFFFFu));
      const __m256i raised =
          _mm256_add_epi32(_mm256_and_si256(bits, broadcast(0xFF800000u)), min_normal);
      bits = _mm256_blendv_epi8(raised, bits, _mm256_cmpeq_epi32(mantissa, _mm256_setzero_si256()));
      const __m256 over =
          _mm256_cmp_ps(_mm256_div_ps(a, _mm256_castsi256_ps(bits)), fm, _CMP_GT_OQ);
      bits = _mm256_add_epi32(bits, _mm256_and_si256(_mm256_castps_si256(over), min_normal));
    }
    bits = _mm256_blendv_epi8(bits, one_bits, special);
    const auto below = [&](__m256i x, uint32_t bound) {  // x < bound, both below 2^31
      return _mm256_cmpgt_epi32(broadcast(bound), x);
    };
    __m256i exponent = _mm256_setzero_si256();
    if (mx) {
      // mx_scale_e8m0 and e8m0_to_float: 2^-127 and below become E8M0 0, which is 2^-127.
      const __m256i floor = below(bits, 0x00400001u);
      exponent = _mm256_andnot_si256(floor, _mm256_srli_epi32(bits, 23));
      bits = _mm256_blendv_epi8(_mm256_slli_epi32(exponent, 23), broadcast(0x00400000u), floor);
    }
    // divisor_with's classes, lane by lane.
    const __m256i mantissa_zero =
        _mm256_cmpeq_epi32(_mm256_and_si256(bits, broadcast(0x007FFFFFu)), _mm256_setzero_si256());
    const __m256i single_bit = _mm256_cmpeq_epi32(
        _mm256_and_si256(bits, _mm256_sub_epi32(bits, broadcast(1))), _mm256_setzero_si256());
    const __m256i power_of_two_s = _mm256_blendv_epi8(
        single_bit, mantissa_zero, _mm256_cmpgt_epi32(bits, broadcast(0x007FFFFFu)));
    const __m256i multiply = _mm256_andnot_si256(
        _mm256_or_si256(below(bits, 0x00400000u), _mm256_cmpgt_epi32(bits, broadcast(0x7F000000u))),
        power_of_two_s);
    const __m256i fma = _mm256_andnot_si256(
        _mm256_or_si256(power_of_two_s,
                        _mm256_or_si256(below(bits, kTwoToMinus60),
                                        _mm256_cmpgt_epi32(bits, broadcast(kTwoTo125 - 1)))),
        _mm256_set1_epi32(-1));
    const __m256i how = _mm256_andnot_si256(
        multiply,
        _mm256_blendv_epi8(broadcast(static_cast<uint32_t>(Division::kDivide)),
                           broadcast(static_cast<uint32_t>(Division::kReciprocalFma)), fma));
    // r = RN(1 / s), or 1 where the lane divides.
    const __m256 r = _mm256_blendv_ps(
        _mm256_set1_ps(1.0f), _mm256_div_ps(_mm256_set1_ps(1.0f), _mm256_castsi256_ps(bits)),
        _mm256_castsi256_ps(_mm256_or_si256(multiply, fma)));
    alignas(32) uint32_t s_lanes[8], how_lanes[8], exponent_lanes[8];
    alignas(32) float r_lanes[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(s_lanes), bits);
    _mm256_store_si256(reinterpret_cast<__m256i*>(how_lanes), how);
    _mm256_store_si256(reinterpret_cast<__m256i*>(exponent_lanes), exponent);
    _mm256_store_ps(r_lanes, r);
    const int fallback = _mm256_movemask_ps(_mm256_castsi256_ps(subnormal));
    for (int l = 0; l < 8; ++l) {
      if ((fallback >> l) & 1) {
        s[i + l] = scalar_scale(amax[i + l], fmt_max, power_of_two, mx, e8m0 + i + l);
        d[i + l] = make_divisor(s[i + l]);
      } else {
        s[i + l] = bits_to_float(s_lanes[l]);
        if (mx) e8m0[i + l] = static_cast<uint8_t>(exponent_lanes[l]);
        d[i + l] = {s[i + l], r_lanes[l], static_cast<Division>(how_lanes[l])};
      }
      d[i + l].finite = amax[i + l] < kF32InfBits;
    }
  }
  if (i < n) {
    // The last n % 8 through the vector code too, padded with zero blocks.
    uint32_t rest[8] = {};
    float rest_s[8];
    uint8_t rest_e8m0[8];
    Divisor rest_d[8];
    std::copy(amax + i, amax + n, rest);
    block_scales(rest, 8, fmt_max, power_of_two, mx, rest_s, rest_e8m0, rest_d);
    std::copy(rest_s, rest_s + (n - i), s + i);
    std::copy(rest_d, rest_d + (n - i), d + i);
    if (mx) std::copy(rest_e8m0, rest_e8m0 + (n - i), e8m0 + i);
  }
}

namespace {

// FP32: the maximum of the magnitude patterns.
[[gnu::always_inline]] inline uint32_t amax_bits32(const float* x, int64_t n) {
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const auto* p = reinterpret_cast<const __m256i*>(x + i);
    m0 = _mm256_max_epu32(m0, _mm256_and_si256(_mm256_loadu_si256(p), magnitude));
    m1 = _mm256_max_epu32(m1, _mm256_and_si256(_mm256_loadu_si256(p + 1), magnitude));
  }
  uint32_t m = horizontal_max_u32(_mm256_max_epu32(m0, m1));
  for (; i < n; ++i) m = std::max(m, float_to_bits(x[i]) & 0x7FFFFFFFu);
  return m;
}

// Eight whole blocks of 16-bit values (block_k a multiple of 16): each block's maximum
// magnitude pattern as sixteen partial maxima, then the eight vectors reduced together -- the
// unpacks pair up blocks while they halve the lanes -- into one vector of eight maxima.
template <class Src>
void amax_eight_blocks16(const Src* x, int64_t block_k, uint32_t* amax) {
  const __m256i magnitude = _mm256_set1_epi16(0x7FFF);
  __m128i m[8];
  for (int j = 0; j < 8; ++j) {
    const auto* p = reinterpret_cast<const __m256i*>(x + j * block_k);
    __m256i v = _mm256_and_si256(_mm256_loadu_si256(p), magnitude);
    for (int64_t t = 1; t < block_k / 16; ++t) {
      v = _mm256_max_epu16(v, _mm256_and_si256(_mm256_loadu_si256(p + t), magnitude));
    }
    m[j] = _mm_max_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  }
  __m128i pairs[4], quads[2];
  for (int j = 0; j < 4; ++j) {  // lanes alternate blocks 2j, 2j+1
    pairs[j] = _mm_max_epu16(_mm_unpacklo_epi16(m[2 * j], m[2 * j + 1]),
                             _mm_unpackhi_epi16(m[2 * j], m[2 * j + 1]));
  }
  for (int j = 0; j < 2; ++j) {  // 32-bit units alternate (4j, 4j+1), (4j+2, 4j+3)
    quads[j] = _mm_max_epu16(_mm_unpacklo_epi32(pairs[2 * j], pairs[2 * j + 1]),
                             _mm_unpackhi_epi32(pairs[2 * j], pairs[2 * j + 1]));
  }
  const __m128i all =
      _mm_max_epu16(_mm_unpacklo_epi64(quads[0], quads[1]), _mm_unpackhi_epi64(quads[0], quads[1]));
  alignas(16) uint16_t lanes[8];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), all);
  for (int j = 0; j < 8; ++j) amax[j] = widened_bits(x, lanes[j]);
}

template <class Src>
void amax_of_blocks(const Src* x, int64_t k, int64_t block_k, uint32_t* amax) {
  int64_t k0 = 0, b = 0;
  if constexpr (sizeof(Src) == 2) {
    if (block_k % 16 == 0) {
      for (; k0 + 8 * block_k <= k; k0 += 8 * block_k, b += 8) {
        amax_eight_blocks16(x + k0, block_k, amax + b);
      }
    }
  }
  for (; k0 < k; k0 += block_k, ++b) {
    if constexpr (sizeof(Src) == 2) {
      amax[b] = amax_bits16(x + k0, std::min(block_k, k - k0));
    } else {
      amax[b] = amax_bits32(x + k0, std::min(block_k, k - k0));
    }
  }
}

}  // namespace

void block_amax(const float* x, int64_t k, int64_t block_k, uint32_t* amax) {
  amax_of_blocks(x, k, block_k, amax);
}
void block_amax(const bf16* x, int64_t k, int64_t block_k, uint32_t* amax) {
  amax_of_blocks(x, k, block_k, amax);
}
void block_amax(const fp16* x, int64_t k, int64_t block_k, uint32_t* amax) {
  amax_of_blocks(x, k, block_k, amax);
}

namespace {

// quantize_row with every block on the method How. Each vector of eight lies in one block
// (block_k is a power of two of at least 16, or the whole row), whose s and r it broadcasts; the
// last k % 8 elements take the scalar definition.
template <class Src, class Code, Division How, bool kNaN>
void row(const Src* x, int64_t k, int64_t block_k, const Divisor* d, uint8_t* out,
         const Src* next) {
  constexpr SmallFloatFormat F = Fp8Format<Code>::value;
  // i / block_k as a shift (block_k a power of two; a single block shifts everything out).
  const int shift = block_k >= k ? 63 : std::countr_zero(static_cast<uint64_t>(block_k));
  const auto block_of = [=](int64_t i) { return i >> shift; };
  const auto codes8 = [&](int64_t i) {
    const Divisor& e = d[block_of(i)];
    const __m256 v = decode8(x + i), s = _mm256_set1_ps(e.s), r = _mm256_set1_ps(e.r);
    if constexpr (How == Division::kDivide || kNaN) {
      return fp8_round8<F, kNaN>(divide8<How>(v, s, r), Saturation::kSatFinite);
    } else {
      return finite_code8<F, How>(v, s, r);
    }
  };
  int64_t i = 0;
  for (; i + 32 <= k; i += 32) {
    if (next != nullptr) {
      for (size_t line = 0; line < 32 * sizeof(Src); line += 64) {
        _mm_prefetch(reinterpret_cast<const char*>(next + i) + line, _MM_HINT_T0);
      }
    }
    store32_u8(out + i, codes8(i), codes8(i + 8), codes8(i + 16), codes8(i + 24));
  }
  for (; i + 8 <= k; i += 8) {
    const __m256i c = codes8(i);
    const __m128i words =
        _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(out + i), _mm_packus_epi16(words, words));
  }
  for (; i < k; ++i) out[i] = scalar_code<Code>(to_float(x[i]), d[block_of(i)].s);
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
void row_blocks(const Src* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                uint8_t* out, const Src* next) {
  if (core::avx512::narrow_enabled()) {
    return avx512::quantize_row(x, k, block_k, d, code, out, next);
  }
  if (code == DType::kE4M3) return row_any_method<Src, fp8_e4m3>(x, k, block_k, d, out, next);
  row_any_method<Src, fp8_e5m2>(x, k, block_k, d, out, next);
}

}  // namespace

void quantize_row(const float* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const float* next) {
  row_blocks(x, k, block_k, d, code, out, next);
}
void quantize_row(const bf16* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const bf16* next) {
  row_blocks(x, k, block_k, d, code, out, next);
}
void quantize_row(const fp16* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const fp16* next) {
  row_blocks(x, k, block_k, d, code, out, next);
}

void amax_columns(const float* x, int64_t stride, int64_t rows, uint32_t amax[kColumns]) {
  const __m256i magnitude = _mm256_set1_epi32(0x7FFFFFFF);
  __m256i m[4] = {_mm256_setzero_si256(), _mm256_setzero_si256(), _mm256_setzero_si256(),
                  _mm256_setzero_si256()};
  for (int64_t row = 0; row < rows; ++row) {
    const auto* p = reinterpret_cast<const __m256i*>(x + row * stride);
    for (int k = 0; k < 4; ++k) {
      m[k] = _mm256_max_epu32(m[k], _mm256_and_si256(_mm256_loadu_si256(p + k), magnitude));
    }
  }
  for (int k = 0; k < 4; ++k) _mm256_storeu_si256(reinterpret_cast<__m256i*>(amax + 8 * k), m[k]);
}
void amax_columns(const bf16* x, int64_t stride, int64_t rows, uint32_t amax[kColumns]) {
  amax_columns16(x, stride, rows, amax);
}
void amax_columns(const fp16* x, int64_t stride, int64_t rows, uint32_t amax[kColumns]) {
  amax_columns16(x, stride, rows, amax);
}

void quantize_columns(const float* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool any_infinite, DType code, uint8_t* out, const float* next) {
  columns_any(x, stride, rows, d, any_infinite, code, out, next);
}
void quantize_columns(const bf16* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool any_infinite, DType code, uint8_t* out, const bf16* next) {
  columns_any(x, stride, rows, d, any_infinite, code, out, next);
}
void quantize_columns(const fp16* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool any_infinite, DType code, uint8_t* out, const fp16* next) {
  columns_any(x, stride, rows, d, any_infinite, code, out, next);
}

// Four rounds of interleaving: bytes of row pairs, then 16-bit pairs of those (four rows),
// 32-bit (eight rows) and 64-bit (sixteen), each round doubling the rows a lane group spans.
void transpose16x16(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  __m128i a[16], b[16], c[16];
  for (int i = 0; i < 16; ++i) {
    a[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * src_stride));
  }
  // b[p]: columns 0-7 of rows 2p, 2p+1; b[p + 8]: columns 8-15.
  for (int p = 0; p < 8; ++p) {
    b[p] = _mm_unpacklo_epi8(a[2 * p], a[2 * p + 1]);
    b[p + 8] = _mm_unpackhi_epi8(a[2 * p], a[2 * p + 1]);
  }
  // c[4 g + q]: columns 4g .. 4g+3 of rows 4q .. 4q+3.
  for (int h = 0; h < 2; ++h) {
    for (int q = 0; q < 4; ++q) {
      c[8 * h + q] = _mm_unpacklo_epi16(b[8 * h + 2 * q], b[8 * h + 2 * q + 1]);
      c[8 * h + 4 + q] = _mm_unpackhi_epi16(b[8 * h + 2 * q], b[8 * h + 2 * q + 1]);
    }
  }
  for (int g = 0; g < 4; ++g) {
    // Rows 0-7 (top) or 8-15 (bottom) of columns 4g, 4g+1 (01) or 4g+2, 4g+3 (23).
    const __m128i top01 = _mm_unpacklo_epi32(c[4 * g], c[4 * g + 1]);
    const __m128i top23 = _mm_unpackhi_epi32(c[4 * g], c[4 * g + 1]);
    const __m128i bottom01 = _mm_unpacklo_epi32(c[4 * g + 2], c[4 * g + 3]);
    const __m128i bottom23 = _mm_unpackhi_epi32(c[4 * g + 2], c[4 * g + 3]);
    const __m128i column[4] = {
        _mm_unpacklo_epi64(top01, bottom01), _mm_unpackhi_epi64(top01, bottom01),
        _mm_unpacklo_epi64(top23, bottom23), _mm_unpackhi_epi64(top23, bottom23)};
    for (int j = 0; j < 4; ++j) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (4 * g + j) * dst_stride), column[j]);
    }
  }
}

}  // namespace mantissa::core::quantize_runs
