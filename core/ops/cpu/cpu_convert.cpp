// Bulk FP32 <-> storage-dtype conversions, eight elements per AVX2 vector.
//
// Every result equals the scalar definition in core/dtype/dtype.h bit for bit, NaN patterns
// included; the vector code computes the same functions another way:
//  - widening: BF16 is the top half of an FP32 pattern (a shift). FP16 goes through the F16C
//    instruction, which is exact, and E5M2/E4M3 are first rewritten as FP16 patterns. NaNs
//    then get dtype.h's canonical pattern (0x7FFFFFFF with the code's sign).
//  - narrowing: BF16 and FP8 round with integer arithmetic on the FP32 pattern, FP16 with
//    F16C; NaN becomes the canonical code. A BF16 or F16 source rounded to nearest
//    (narrow_from_16bit) is widened vector by vector in registers on the way.
//  - stochastic rounding: random_u32 is computed for eight indices at once, with the key of
//    their run of 2^32 indices derived once per run, and compared as dtype.h compares it;
//    lanes that need a slower rule (subnormal results, inf, NaN, overflow) cost it only in
//    the vectors that hold one.
//  - amax is the maximum of |x|'s bit pattern: non-negative floats order like their patterns
//    and every NaN pattern lies above +inf, so a NaN wins the maximum, i.e. propagates.
// On CPUs with AVX-512, stochastic rounding and rounding to FP8 run the sixteen-lane kernels of
// cpu_narrow_avx512.cpp instead (narrow_nearest_block, narrow_stochastic_block).
// A conversion is split into fixed blocks handed to OpenMP threads; a block runs the vector
// loop and finishes its last few elements with the scalar functions. The block kernels take
// their arguments by value: vector stores may alias anything, so values read through a
// reference would be reloaded on every iteration.
#include "core/ops/cpu/cpu_convert.h"

#include <immintrin.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <type_traits>

#include "core/error.h"
#include "core/ops/cpu/cpu_convert8.h"
#include "core/ops/cpu/cpu_fp8_round8.h"
#include "core/ops/cpu/cpu_narrow_avx512.h"
#include "core/ops/cpu/narrow_formats.h"

#if !defined(__AVX2__) || !defined(__F16C__)
#error "cpu_convert.cpp needs AVX2 and F16C (build with -march=x86-64-v3)"
#endif

namespace mantissa::core {
namespace {

constexpr int64_t kBlock = 1 << 14;        // elements per OpenMP work item
constexpr int64_t kParallelMin = 1 << 16;  // below this, waking threads costs more than it saves
constexpr uint32_t kAbsMask = 0x7FFFFFFFu;

// Runs body(begin, end) over [0, n) in blocks, on every OpenMP thread when n is large, and
// returns the maximum of what the bodies return (the amax pattern when narrowing).
template <class Body>
uint32_t for_blocks(int64_t n, const Body& body) {
  uint32_t result = 0;
#pragma omp parallel for schedule(static) reduction(max : result) if (n >= kParallelMin)
  for (int64_t begin = 0; begin < n; begin += kBlock) {
    result = std::max(result, body(begin, std::min(n, begin + kBlock)));
  }
  return result;
}

__m256i broadcast(uint32_t x) {
  return _mm256_set1_epi32(static_cast<int>(x));
}

__m256i abs_bits(__m256 x) {
  return _mm256_and_si256(_mm256_castps_si256(x), broadcast(kAbsMask));
}

uint32_t horizontal_max(__m256i v) {
  __m128i m = _mm_max_epu32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0b01001110));
  m = _mm_max_epu32(m, _mm_shuffle_epi32(m, 0b10110001));
  return static_cast<uint32_t>(_mm_cvtsi128_si32(m));
}

// --- widening --------------------------------------------------------------------------------

// decode8 (cpu_convert8.h) reads eight stored values as FP32.
template <class T>
void widen_block(const T* src, float* dst, int64_t begin, int64_t end, float scale) {
  const __m256 s = _mm256_set1_ps(scale);
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) _mm256_storeu_ps(dst + i, _mm256_mul_ps(decode8(src + i), s));
  for (; i < end; ++i) dst[i] = to_float(src[i]) * scale;
}

template <class T>
void widen(const T* src, float* dst, int64_t n, float scale) {
  for_blocks(n, [&](int64_t begin, int64_t end) {
    widen_block(src, dst, begin, end, scale);
    return 0u;
  });
}

// --- narrowing -------------------------------------------------------------------------------

// Four vectors of 32-bit lanes holding 16-bit codes (a, b, c, d), stored as 32 uint16.
void store32_u16(void* dst, __m256i a, __m256i b, __m256i c, __m256i d) {
  // packus interleaves 128-bit halves: [a0-3 b0-3 | a4-7 b4-7]; the qword permute restores order.
  __m256i* out = static_cast<__m256i*>(dst);
  _mm256_storeu_si256(out, _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0b11011000));
  _mm256_storeu_si256(out + 1, _mm256_permute4x64_epi64(_mm256_packus_epi32(c, d), 0b11011000));
}

// round32(x, dst, saturation): dst[i] = Rounder<T>::nearest(x[i], saturation) for the 32
// values in x[0..3].
void round32(const __m256 x[4], float* dst, Saturation) {
  for (int k = 0; k < 4; ++k) _mm256_storeu_ps(dst + 8 * k, x[k]);
}

// bf16_round8 (cpu_convert8.h) rounds eight values to BF16 codes.
void round32(const __m256 x[4], bf16* dst, Saturation) {
  store32_u16(dst, bf16_round8(x[0]), bf16_round8(x[1]), bf16_round8(x[2]), bf16_round8(x[3]));
}

// F16C rounds to nearest even with IEEE overflow to inf, like fp16_from_float. A NaN keeps
// the top 10 bits of its payload and gets the quiet bit, so feeding it the all-ones NaN
// yields dtype.h's canonical 0x7FFF (the sign is dropped first, as dtype.h drops it).
__m128i fp16_round8(__m256 x) {
  const __m256 is_nan = _mm256_cmp_ps(x, x, _CMP_UNORD_Q);
  const __m256 input = _mm256_blendv_ps(x, _mm256_castsi256_ps(broadcast(kAbsMask)), is_nan);
  return _mm256_cvtps_ph(input, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
}

void round32(const __m256 x[4], fp16* dst, Saturation) {
  for (int k = 0; k < 4; ++k) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 8 * k), fp16_round8(x[k]));
  }
}

// fp8_round8 (cpu_fp8_round8.h) rounds eight values to FP8 codes.
template <class T, SmallFloatFormat F = Fp8Format<T>::value>
void round32(const __m256 x[4], T* dst, Saturation saturation) {
  store32_u8(dst, fp8_round8<F>(x[0], saturation), fp8_round8<F>(x[1], saturation),
             fp8_round8<F>(x[2], saturation), fp8_round8<F>(x[3], saturation));
}

// --- stochastic rounding ---------------------------------------------------------------------

// dtype.h's hash32 on eight lanes.
__m256i hash8(__m256i x) {
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 16));
  x = _mm256_mullo_epi32(x, broadcast(kHash32Multiply1));
  x = _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
  x = _mm256_mullo_epi32(x, broadcast(kHash32Multiply2));
  return _mm256_xor_si256(x, _mm256_srli_epi32(x, 15));
}

// random_u32(key, offsets[k]) in each lane k.
__m256i random8(RandomKey key, __m256i offsets) {
  const __m256i first_round = hash8(_mm256_xor_si256(offsets, broadcast(key.first)));
  return hash8(_mm256_xor_si256(first_round, broadcast(key.second)));
}

// Lanes where `rare` is set take their code from nearest() instead of `code`. Such lanes (inf,
// NaN, values past the format's range) are rare enough that testing for them costs less than
// computing nearest() for every vector.
template <class Nearest>
__m256i replace_rare(__m256i code, __m256i rare, const Nearest& nearest) {
  if (_mm256_testz_si256(rare, rare)) return code;
  return _mm256_blendv_epi8(code, nearest(), rare);
}

// bf16_from_float_stochastic: round up when the 16 dropped bits exceed the top 16 random
// bits; inf and NaN take the nearest-even path.
__m256i bf16_stochastic8(__m256 x, __m256i random) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i dropped = _mm256_and_si256(bits, broadcast(0xFFFF));
  const __m256i up = _mm256_cmpgt_epi32(dropped, _mm256_srli_epi32(random, 16));  // -1 or 0
  const __m256i code = _mm256_sub_epi32(_mm256_srli_epi32(bits, 16), up);
  const __m256i special =
      _mm256_cmpeq_epi32(_mm256_and_si256(bits, broadcast(kF32InfBits)), broadcast(kF32InfBits));
  return replace_rare(code, special, [&] { return bf16_round8(x); });
}

// float_to_small_stochastic's code magnitude for |x| (abs) below the smallest normal, zero
// included: whole steps of the smallest subnormal, 2^(1 - bias - man_bits), and the same
// comparison as dtype.h's (see small_stochastic8), in FP32 where every quantity is exact
// (scaling by a power of two is exact; the conversion truncates).
template <SmallFloatFormat F>
__m256i subnormal_stochastic8(__m256i abs, __m256i random) {
  const __m256 magnitude = _mm256_castsi256_ps(abs);
  const __m256 step = _mm256_castsi256_ps(broadcast((128u - F.bias - F.man_bits) << 23));
  const __m256 steps_per_unit = _mm256_castsi256_ps(broadcast((126u + F.bias + F.man_bits) << 23));
  const __m256i lo = _mm256_cvttps_epi32(_mm256_mul_ps(magnitude, steps_per_unit));
  const __m256 lo_value = _mm256_mul_ps(_mm256_cvtepi32_ps(lo), step);
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(random, 8)),
                                 _mm256_set1_ps(1.0f / 16777216.0f));
  const __m256i up = _mm256_castps_si256(
      _mm256_cmp_ps(_mm256_mul_ps(u, step), _mm256_sub_ps(magnitude, lo_value), _CMP_LT_OQ));
  return _mm256_sub_epi32(lo, up);
}

// float_to_small_stochastic, eight lanes at a time; lanes past max finite (and NaN) take
// nearest(), their float_to_small_rne codes. dtype.h finds the code lo truncating |x| toward
// zero and the gap to the next code, and rounds up when u * gap < |x| - value(lo) with
// u = (random >> 8) / 2^24.
template <SmallFloatFormat F, class Nearest>
__m256i small_stochastic8(__m256 x, __m256i random, const Nearest& nearest) {
  constexpr int kDrop = 23 - F.man_bits;  // FP32 mantissa bits that do not fit
  const __m256i abs = abs_bits(x);

  // Normal range: truncating the FP32 mantissa truncates the value, the gap is 2^(e - man_bits)
  // and |x| - value(lo) = dropped 2^(e - 23) (dropped: the kDrop low bits of |x|), so the test
  // reads (random >> 8) < dropped 2^(24 - kDrop), i.e. (random >> (32 - kDrop)) < dropped.
  const __m256i lo =
      _mm256_sub_epi32(_mm256_srli_epi32(abs, kDrop), broadcast((127u - F.bias) << F.man_bits));
  const __m256i up = _mm256_cmpgt_epi32(_mm256_and_si256(abs, broadcast((1u << kDrop) - 1)),
                                        _mm256_srli_epi32(random, 32 - kDrop));  // -1 or 0
  __m256i magnitude = _mm256_sub_epi32(lo, up);
  const __m256i is_subnormal = _mm256_cmpgt_epi32(broadcast(F.min_normal_bits), abs);
  if (!_mm256_testz_si256(is_subnormal, is_subnormal)) {
    magnitude = _mm256_blendv_epi8(magnitude, subnormal_stochastic8<F>(abs, random), is_subnormal);
  }

  const __m256i sign = _mm256_and_si256(
      _mm256_srli_epi32(_mm256_castps_si256(x), 31 - F.sign_shift), broadcast(1u << F.sign_shift));
  return replace_rare(_mm256_or_si256(magnitude, sign),
                      _mm256_cmpgt_epi32(abs, broadcast(code_bits(F, F.max_finite_code))), nearest);
}

// round32_stochastic(x, random, dst, saturation): dst[i] = Rounder<T>::stochastic(x[i],
// random[i], saturation) for the 32 values in x[0..3] and random numbers in random[0..3].
void round32_stochastic(const __m256 x[4], const __m256i[4], float* dst, Saturation) {
  for (int k = 0; k < 4; ++k) _mm256_storeu_ps(dst + 8 * k, x[k]);
}

void round32_stochastic(const __m256 x[4], const __m256i random[4], bf16* dst, Saturation) {
  store32_u16(dst, bf16_stochastic8(x[0], random[0]), bf16_stochastic8(x[1], random[1]),
              bf16_stochastic8(x[2], random[2]), bf16_stochastic8(x[3], random[3]));
}

// FP16 has no saturation mode (overflow is inf), as in Rounder<fp16>.
__m256i fp16_stochastic8(__m256 x, __m256i random) {
  return small_stochastic8<fp16_format()>(x, random,
                                          [&] { return _mm256_cvtepu16_epi32(fp16_round8(x)); });
}

void round32_stochastic(const __m256 x[4], const __m256i random[4], fp16* dst, Saturation) {
  store32_u16(dst, fp16_stochastic8(x[0], random[0]), fp16_stochastic8(x[1], random[1]),
              fp16_stochastic8(x[2], random[2]), fp16_stochastic8(x[3], random[3]));
}

template <SmallFloatFormat F>
__m256i fp8_stochastic8(__m256 x, __m256i random, Saturation saturation) {
  return small_stochastic8<F>(x, random, [&] { return fp8_round8<F>(x, saturation); });
}

template <class T, SmallFloatFormat F = Fp8Format<T>::value>
void round32_stochastic(const __m256 x[4], const __m256i random[4], T* dst, Saturation saturation) {
  store32_u8(dst, fp8_stochastic8<F>(x[0], random[0], saturation),
             fp8_stochastic8<F>(x[1], random[1], saturation),
             fp8_stochastic8<F>(x[2], random[2], saturation),
             fp8_stochastic8<F>(x[3], random[3], saturation));
}

// dst[i] = round(src[i] * scale, i) one element at a time over [begin, end), src widened to
// FP32 first; returns the amax pattern of the (widened) input there.
template <class Src, class T, class Round>
uint32_t narrow_scalar(const Src* src, T* dst, int64_t begin, int64_t end, float scale,
                       const Round& round) {
  uint32_t amax = 0;
  for (int64_t i = begin; i < end; ++i) {
    const float x = to_float(src[i]);
    amax = std::max(amax, std::bit_cast<uint32_t>(x) & kAbsMask);
    dst[i] = round(x * scale, i);
  }
  return amax;
}

// Rounds [begin, end) to nearest, 32 elements per step (so that codes pack into whole
// vectors), and returns the amax pattern of the input there. A BF16 or F16 source is widened
// as it is loaded (decode8).
template <class Src, class T>
uint32_t narrow_nearest(const Src* src, T* dst, int64_t begin, int64_t end, NarrowOptions o) {
  const __m256 scale = _mm256_set1_ps(o.scale);
  __m256i vector_amax = _mm256_setzero_si256();
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    __m256 x[4];
    for (int k = 0; k < 4; ++k) {
      x[k] = decode8(src + i + 8 * k);
      vector_amax = _mm256_max_epu32(vector_amax, abs_bits(x[k]));
      x[k] = _mm256_mul_ps(x[k], scale);
    }
    round32(x, dst + i, o.saturation);
  }
  const uint32_t tail_amax = narrow_scalar(src, dst, i, end, o.scale, [&](float y, int64_t) {
    return Rounder<T>::nearest(y, o.saturation);
  });
  return std::max(horizontal_max(vector_amax), tail_amax);
}

// Rounds [begin, end) stochastically, 32 elements per step, and returns the amax pattern of
// the input there. The indices index_base + i lie in one run of 2^32 with random key `key`;
// first_offset is that of `begin` in the run (offsets do not wrap).
// flatten: GCC otherwise keeps the per-vector rounding functions out of line, and passing
// their vectors through memory doubled the cost of F16 and FP8.
template <class T>
[[gnu::flatten]] uint32_t narrow_stochastic_run(const float* src, T* dst, int64_t begin,
                                                int64_t end, NarrowOptions o, RandomKey key,
                                                uint32_t first_offset) {
  const __m256 scale = _mm256_set1_ps(o.scale);
  __m256i vector_amax = _mm256_setzero_si256();
  __m256i offsets =
      _mm256_add_epi32(broadcast(first_offset), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  int64_t i = begin;
  for (; i + 32 <= end; i += 32) {
    __m256 x[4];
    __m256i random[4];
    for (int k = 0; k < 4; ++k) {
      x[k] = _mm256_loadu_ps(src + i + 8 * k);
      vector_amax = _mm256_max_epu32(vector_amax, abs_bits(x[k]));
      x[k] = _mm256_mul_ps(x[k], scale);
      random[k] = random8(key, offsets);
      offsets = _mm256_add_epi32(offsets, broadcast(8));
    }
    round32_stochastic(x, random, dst + i, o.saturation);
  }
  const uint32_t tail_amax = narrow_scalar(src, dst, i, end, o.scale, [&](float y, int64_t j) {
    const uint32_t offset = first_offset + static_cast<uint32_t>(j - begin);
    return Rounder<T>::stochastic(y, random_u32(key, offset), o.saturation);
  });
  return std::max(horizontal_max(vector_amax), tail_amax);
}

// The AVX-512 kernels (cpu_narrow_avx512.h) where the CPU has them, else the AVX2 ones above.
// AVX2 keeps FP32 -> FP32 (a scaled copy) and round-to-nearest BF16 and F16, which it does at
// memory speed.
template <class Src, class T>
uint32_t narrow_nearest_block(const Src* src, T* dst, int64_t begin, int64_t end, NarrowOptions o) {
  if constexpr (requires { Fp8Format<T>::value; }) {
    if (avx512::narrow_enabled()) {
      return avx512::narrow_nearest(src + begin, dst + begin, end - begin, o.scale, o.saturation);
    }
  }
  return narrow_nearest(src, dst, begin, end, o);
}

template <class T>
uint32_t narrow_stochastic_block(const float* src, T* dst, int64_t begin, int64_t end,
                                 NarrowOptions o, RandomKey key, uint32_t first_offset) {
  if constexpr (!std::is_same_v<T, float>) {
    if (avx512::narrow_enabled()) {
      return avx512::narrow_stochastic(src + begin, dst + begin, end - begin, o.scale, o.saturation,
                                       {key, first_offset});
    }
  }
  return narrow_stochastic_run(src, dst, begin, end, o, key, first_offset);
}

// Narrows [begin, end) and returns the amax pattern of the input there. Stochastic rounding
// goes run by run of 2^32 indices, deriving each run's random key once.
template <class T>
uint32_t narrow_block(const float* src, T* dst, int64_t begin, int64_t end, NarrowOptions o) {
  if (!o.stochastic) return narrow_nearest_block(src, dst, begin, end, o);
  uint32_t amax = 0;
  for (int64_t run_begin = begin; run_begin < end;) {
    const uint64_t first = o.index_base + static_cast<uint64_t>(run_begin);
    const uint32_t first_offset = static_cast<uint32_t>(first);
    const int64_t run_end = std::min(end, run_begin + ((int64_t{1} << 32) - first_offset));
    const RandomKey key = random_key(o.seed, static_cast<uint32_t>(first >> 32));
    amax =
        std::max(amax, narrow_stochastic_block(src, dst, run_begin, run_end, o, key, first_offset));
    run_begin = run_end;
  }
  return amax;
}

// The amax that narrow_from_f32 returns, from the largest magnitude pattern.
float amax_result(uint32_t amax_bits, const NarrowOptions& o) {
  if (!o.want_amax) return 0.0f;
  return amax_from_abs_bits(amax_bits);
}

template <class T>
float narrow(const float* src, T* dst, int64_t n, const NarrowOptions& o) {
  return amax_result(
      for_blocks(n,
                 [&](int64_t begin, int64_t end) { return narrow_block(src, dst, begin, end, o); }),
      o);
}

template <class Src, class T>
float narrow_nearest_from(const Src* src, T* dst, int64_t n, const NarrowOptions& o) {
  return amax_result(
      for_blocks(n, [&](int64_t begin,
                        int64_t end) { return narrow_nearest_block(src, dst, begin, end, o); }),
      o);
}

template <class Src>
float narrow_16bit(const Src* src, void* dst, DType dst_dtype, int64_t n, const NarrowOptions& o) {
  switch (dst_dtype) {
    case DType::kF32: return narrow_nearest_from(src, static_cast<float*>(dst), n, o);
    case DType::kBF16: return narrow_nearest_from(src, static_cast<bf16*>(dst), n, o);
    case DType::kF16: return narrow_nearest_from(src, static_cast<fp16*>(dst), n, o);
    case DType::kE4M3: return narrow_nearest_from(src, static_cast<fp8_e4m3*>(dst), n, o);
    case DType::kE5M2: return narrow_nearest_from(src, static_cast<fp8_e5m2*>(dst), n, o);
    default:
      MANTISSA_FAIL("narrow_from_16bit: " << dtype_name(dst_dtype) << " is not a float dtype");
  }
}

}  // namespace

void widen_to_f32(const void* src, DType src_dtype, float* dst, int64_t n, float scale) {
  switch (src_dtype) {
    case DType::kF32: return widen(static_cast<const float*>(src), dst, n, scale);
    case DType::kBF16: return widen(static_cast<const bf16*>(src), dst, n, scale);
    case DType::kF16: return widen(static_cast<const fp16*>(src), dst, n, scale);
    case DType::kE4M3: return widen(static_cast<const fp8_e4m3*>(src), dst, n, scale);
    case DType::kE5M2: return widen(static_cast<const fp8_e5m2*>(src), dst, n, scale);
    default: MANTISSA_FAIL("widen_to_f32: " << dtype_name(src_dtype) << " is not a float dtype");
  }
}

float narrow_from_f32(const float* src, void* dst, DType dst_dtype, int64_t n,
                      const NarrowOptions& options) {
  switch (dst_dtype) {
    case DType::kF32: return narrow(src, static_cast<float*>(dst), n, options);
    case DType::kBF16: return narrow(src, static_cast<bf16*>(dst), n, options);
    case DType::kF16: return narrow(src, static_cast<fp16*>(dst), n, options);
    case DType::kE4M3: return narrow(src, static_cast<fp8_e4m3*>(dst), n, options);
    case DType::kE5M2: return narrow(src, static_cast<fp8_e5m2*>(dst), n, options);
    default: MANTISSA_FAIL("narrow_from_f32: " << dtype_name(dst_dtype) << " is not a float dtype");
  }
}

float narrow_from_16bit(const void* src, DType src_dtype, void* dst, DType dst_dtype, int64_t n,
                        const NarrowOptions& options) {
  MANTISSA_CHECK(!options.stochastic,
                 "narrow_from_16bit rounds to nearest; stochastic rounding starts from FP32");
  switch (src_dtype) {
    case DType::kBF16:
      return narrow_16bit(static_cast<const bf16*>(src), dst, dst_dtype, n, options);
    case DType::kF16:
      return narrow_16bit(static_cast<const fp16*>(src), dst, dst_dtype, n, options);
    default:
      MANTISSA_FAIL("narrow_from_16bit: the source is " << dtype_name(src_dtype)
                                                        << ", not BF16 or F16");
  }
}

}  // namespace mantissa::core
