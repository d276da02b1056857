// FP32 -> storage-dtype narrowing with AVX-512, sixteen lanes at a time.
//
// The functions are those of cpu_convert.cpp's AVX2 code, whose comments say why each rule
// gives dtype.h's result; this file writes them with what AVX-512 adds:
//  - a compare gives a mask register, so a lane-wise choice is one masked move and "round
//    up" is a masked add of one;
//  - stochastic rounding hashes its random numbers in the same loop, sixteen lanes per
//    multiply, where the AVX2 code goes through a buffer;
//  - masked loads and stores (VPMOVDW/VPMOVDB) finish an array in vector code, so there is
//    no scalar tail.
// Only the functions defined between the push_options and pop_options pragmas are compiled
// for AVX-512. Inline functions from headers keep the baseline ISA, so the copy of one that
// the linker keeps for every file never needs AVX-512.
#include "core/ops/cpu/cpu_narrow_avx512.h"

#include <immintrin.h>

#include <type_traits>

#include "core/ops/cpu/cpu_switch.h"
#include "core/ops/cpu/narrow_formats.h"

namespace mantissa::core::avx512 {

bool narrow_enabled() {
  static const bool enabled = [] {
    return env_switch_on(kAvx512ConvertSwitch) && __builtin_cpu_supports("avx512f") &&
           __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
           __builtin_cpu_supports("avx512dq");
  }();
  return enabled;
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")
// GCC 12's AVX-512 intrinsics pass a deliberately self-initialised "undefined" vector as the
// unused merge operand, which -Wuninitialized reports once they are inlined (GCC bug 105593).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

}  // namespace mantissa::core::avx512

#include "core/ops/cpu/cpu_decode16.h"
#include "core/ops/cpu/cpu_fp8_round16.h"

namespace mantissa::core::avx512 {
namespace {

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr __mmask16 kAllLanes = 0xFFFF;

// Selects the rounding functions of one destination type.
template <class T>
struct To {};

__m512i broadcast(uint32_t x) {
  return _mm512_set1_epi32(static_cast<int>(x));
}

__m512i abs_bits(__m512 x) {
  return _mm512_and_si512(_mm512_castps_si512(x), broadcast(kAbsMask));
}

__m512i add_one(__m512i v, __mmask16 lanes) {
  return _mm512_mask_add_epi32(v, lanes, v, broadcast(1));
}

// --- round to nearest even: each returns the codes in 32-bit lanes ----------------------------

__m512i nearest16(To<bf16>, __m512 x, Saturation) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i lowest_kept = _mm512_and_si512(_mm512_srli_epi32(bits, 16), broadcast(1));
  const __m512i rounded = _mm512_srli_epi32(
      _mm512_add_epi32(bits, _mm512_add_epi32(broadcast(0x7FFF), lowest_kept)), 16);
  const __mmask16 is_nan = _mm512_cmpgt_epu32_mask(abs_bits(x), broadcast(kF32InfBits));
  return _mm512_mask_mov_epi32(rounded, is_nan, broadcast(0x7FFF));
}

__m512i nearest16(To<fp16>, __m512 x, Saturation) {
  const __mmask16 is_nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
  const __m512 input = _mm512_mask_mov_ps(x, is_nan, _mm512_castsi512_ps(broadcast(kAbsMask)));
  return _mm512_cvtepu16_epi32(
      _mm512_cvtps_ph(input, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}

// fp8_round16 (cpu_fp8_round16.h) rounds to FP8.
template <class T, SmallFloatFormat F = Fp8Format<T>::value>
__m512i nearest16(To<T>, __m512 x, Saturation saturation) {
  return fp8_round16<F>(x, saturation);
}

// --- stochastic rounding ---------------------------------------------------------------------

__m512i hash32(__m512i x) {
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 16));
  x = _mm512_mullo_epi32(x, broadcast(kHash32Multiply1));
  x = _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
  x = _mm512_mullo_epi32(x, broadcast(kHash32Multiply2));
  return _mm512_xor_si512(x, _mm512_srli_epi32(x, 15));
}

// random_u32(key, offsets[i]) in each lane.
__m512i random16(RandomKey key, __m512i offsets) {
  const __m512i first_round = hash32(_mm512_xor_si512(offsets, broadcast(key.first)));
  return hash32(_mm512_xor_si512(first_round, broadcast(key.second)));
}

// Round up when the 16 dropped bits exceed the top 16 random bits; inf and NaN round to
// nearest.
__m512i stochastic16(To<bf16>, __m512 x, __m512i random, Saturation saturation) {
  const __m512i bits = _mm512_castps_si512(x);
  const __m512i dropped = _mm512_and_si512(bits, broadcast(0xFFFF));
  const __mmask16 up = _mm512_cmpgt_epu32_mask(dropped, _mm512_srli_epi32(random, 16));
  const __m512i code = add_one(_mm512_srli_epi32(bits, 16), up);
  const __mmask16 special = _mm512_cmpeq_epi32_mask(_mm512_and_si512(bits, broadcast(kF32InfBits)),
                                                    broadcast(kF32InfBits));
  if (special == 0) return code;
  return _mm512_mask_mov_epi32(code, special, nearest16(To<bf16>{}, x, saturation));
}

// Code magnitudes for |x| below the smallest normal: whole steps of the smallest subnormal,
// rounded up when u * step < |x| - value(lo). Every quantity is exact in FP32:
//  - 2^k with k = log2(step) + 23 has an ulp of one step, and |x| + 2^k stays below 2^(k+1),
//    so adding them rounding toward zero truncates |x| to whole steps; the low bits of the
//    sum are lo;
//  - |x| - value(lo) lies within one step of |x| (Sterbenz), and u * step is a 24-bit
//    integer times a power of two.
template <SmallFloatFormat F>
__m512i subnormal_stochastic16(__m512i abs, __m512i random) {
  const __m512 magnitude = _mm512_castsi512_ps(abs);
  const __m512 two_to_k =
      _mm512_castsi512_ps(broadcast((127u + 23 + 1 - F.bias - F.man_bits) << 23));
  const __m512 truncated =
      _mm512_add_round_ps(magnitude, two_to_k, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
  const __m512i lo =
      _mm512_sub_epi32(_mm512_castps_si512(truncated), _mm512_castps_si512(two_to_k));
  const __m512 rest = _mm512_sub_ps(magnitude, _mm512_sub_ps(truncated, two_to_k));
  // u * step = (random >> 8) * 2^-24 * step, and step * 2^-24 = 2^(1 - bias - man_bits - 24).
  const __m512 u_times_step =
      _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(random, 8)),
                    _mm512_castsi512_ps(broadcast((127u + 1 - 24 - F.bias - F.man_bits) << 23)));
  return add_one(lo, _mm512_cmp_ps_mask(u_times_step, rest, _CMP_LT_OQ));
}

// float_to_small_stochastic: in the normal range lo truncates the mantissa and the test
// u * gap < |x| - value(lo) reads (random >> (32 - dropped bits)) < dropped mantissa bits.
// Lanes past max finite, and NaN, take their nearest() codes.
template <SmallFloatFormat F, class Nearest>
__m512i small_stochastic16(__m512 x, __m512i random, const Nearest& nearest) {
  constexpr int kDrop = 23 - F.man_bits;
  const __m512i abs = abs_bits(x);

  const __m512i lo =
      _mm512_sub_epi32(_mm512_srli_epi32(abs, kDrop), broadcast((127u - F.bias) << F.man_bits));
  const __mmask16 up = _mm512_cmpgt_epu32_mask(_mm512_and_si512(abs, broadcast((1u << kDrop) - 1)),
                                               _mm512_srli_epi32(random, 32 - kDrop));
  __m512i magnitude = add_one(lo, up);
  const __mmask16 is_subnormal = _mm512_cmplt_epu32_mask(abs, broadcast(F.min_normal_bits));
  if (is_subnormal != 0) {
    magnitude =
        _mm512_mask_mov_epi32(magnitude, is_subnormal, subnormal_stochastic16<F>(abs, random));
  }

  const __m512i sign = _mm512_and_si512(
      _mm512_srli_epi32(_mm512_castps_si512(x), 31 - F.sign_shift), broadcast(1u << F.sign_shift));
  const __m512i code = _mm512_or_si512(magnitude, sign);
  const __mmask16 rare = _mm512_cmpgt_epu32_mask(abs, broadcast(code_bits(F, F.max_finite_code)));
  if (rare == 0) return code;
  return _mm512_mask_mov_epi32(code, rare, nearest());
}

__m512i stochastic16(To<fp16>, __m512 x, __m512i random, Saturation saturation) {
  return small_stochastic16<fp16_format()>(x, random,
                                           [&] { return nearest16(To<fp16>{}, x, saturation); });
}

template <class T, SmallFloatFormat F = Fp8Format<T>::value>
__m512i stochastic16(To<T>, __m512 x, __m512i random, Saturation saturation) {
  return small_stochastic16<F>(x, random, [&] { return nearest16(To<T>{}, x, saturation); });
}

// --- the loop --------------------------------------------------------------------------------

// Stores the codes of the lanes set in `lanes` to dst as T-sized values (VPMOVDW/VPMOVDB).
template <class T>
void store16(T* dst, __m512i codes, __mmask16 lanes) {
  if constexpr (sizeof(T) == 2) {
    _mm512_mask_cvtepi32_storeu_epi16(dst, lanes, codes);
  } else {
    _mm512_mask_cvtepi32_storeu_epi8(dst, lanes, codes);
  }
}

// Stores 64 bytes of codes: 32 16-bit codes from two vectors, or 64 8-bit codes from four.
// Saturating packs narrow the lanes (every code fits) but interleave the 128-bit quarters of
// their operands, which one permute puts back in order; that costs less than one VPMOVDW or
// VPMOVDB per vector.
void store64(uint16_t* dst, const __m512i codes[2]) {
  const __m512i packed = _mm512_packus_epi32(codes[0], codes[1]);  // quarter q: a[q] b[q]
  const __m512i order = _mm512_setr_epi64(0, 2, 4, 6, 1, 3, 5, 7);
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi64(order, packed));
}

void store64(uint8_t* dst, const __m512i codes[4]) {
  const __m512i packed = _mm512_packus_epi16(_mm512_packus_epi32(codes[0], codes[1]),
                                             _mm512_packus_epi32(codes[2], codes[3]));
  // quarter q: a[q] b[q] c[q] d[q], four codes each
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_si512(dst, _mm512_permutexvar_epi32(order, packed));
}

// dst[i] = codes of round(src[i] * scale, i) over [0, n), returning the amax pattern of src
// (widened to FP32 as it is loaded, decode16). round(x, i) takes the scaled values of elements
// i..i+15. The body converts 64 bytes of codes per step; the rest goes sixteen at a time, the
// last n % 16 under a mask.
template <class Src, class T, class Round>
uint32_t narrow_loop(const Src* src, T* dst, int64_t n, float scale, const Round& round) {
  using Code = std::conditional_t<sizeof(T) == 2, uint16_t, uint8_t>;
  constexpr int kVectors = sizeof(T) == 2 ? 2 : 4;
  Code* codes_out = reinterpret_cast<Code*>(dst);
  const __m512 scale16 = _mm512_set1_ps(scale);
  __m512i amax = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 16 * kVectors <= n; i += 16 * kVectors) {
    __m512i codes[kVectors];
    for (int v = 0; v < kVectors; ++v) {
      const __m512 x = decode16(src + i + 16 * v, kAllLanes);
      amax = _mm512_max_epu32(amax, abs_bits(x));
      codes[v] = round(_mm512_mul_ps(x, scale16), i + 16 * v);
    }
    store64(codes_out + i, codes);
  }
  for (; i < n; i += 16) {
    const __mmask16 lanes = n - i >= 16 ? kAllLanes : static_cast<__mmask16>((1u << (n - i)) - 1);
    const __m512 x = decode16(src + i, lanes);
    amax = _mm512_max_epu32(amax, abs_bits(x));
    store16(codes_out + i, round(_mm512_mul_ps(x, scale16), i), lanes);
  }
  return _mm512_reduce_max_epu32(amax);
}

template <class Src, class T>
uint32_t nearest_loop(const Src* src, T* dst, int64_t n, float scale, Saturation saturation) {
  return narrow_loop(src, dst, n, scale,
                     [=](__m512 x, int64_t) { return nearest16(To<T>{}, x, saturation); });
}

template <class T>
uint32_t stochastic_loop(const float* src, T* dst, int64_t n, float scale, Saturation saturation,
                         StochasticRun run) {
  const __m512i lane_offsets =
      _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  return narrow_loop(src, dst, n, scale, [=](__m512 x, int64_t i) {
    const uint32_t first = run.first_offset + static_cast<uint32_t>(i);
    const __m512i random = random16(run.key, _mm512_add_epi32(broadcast(first), lane_offsets));
    return stochastic16(To<T>{}, x, random, saturation);
  });
}

}  // namespace

uint32_t narrow_nearest(const float* src, fp8_e4m3* dst, int64_t n, float scale, Saturation s) {
  return nearest_loop(src, dst, n, scale, s);
}
uint32_t narrow_nearest(const float* src, fp8_e5m2* dst, int64_t n, float scale, Saturation s) {
  return nearest_loop(src, dst, n, scale, s);
}
uint32_t narrow_nearest(const bf16* src, fp8_e4m3* dst, int64_t n, float scale, Saturation s) {
  return nearest_loop(src, dst, n, scale, s);
}
uint32_t narrow_nearest(const bf16* src, fp8_e5m2* dst, int64_t n, float scale, Saturation s) {
  return nearest_loop(src, dst, n, scale, s);
}
uint32_t narrow_nearest(const fp16* src, fp8_e4m3* dst, int64_t n, float scale, Saturation s) {
  return nearest_loop(src, dst, n, scale, s);
}
uint32_t narrow_nearest(const fp16* src, fp8_e5m2* dst, int64_t n, float scale, Saturation s) {
  return nearest_loop(src, dst, n, scale, s);
}

uint32_t narrow_stochastic(const float* src, bf16* dst, int64_t n, float scale, Saturation s,
                           StochasticRun run) {
  return stochastic_loop(src, dst, n, scale, s, run);
}
uint32_t narrow_stochastic(const float* src, fp16* dst, int64_t n, float scale, Saturation s,
                           StochasticRun run) {
  return stochastic_loop(src, dst, n, scale, s, run);
}
uint32_t narrow_stochastic(const float* src, fp8_e4m3* dst, int64_t n, float scale, Saturation s,
                           StochasticRun run) {
  return stochastic_loop(src, dst, n, scale, s, run);
}
uint32_t narrow_stochastic(const float* src, fp8_e5m2* dst, int64_t n, float scale, Saturation s,
                           StochasticRun run) {
  return stochastic_loop(src, dst, n, scale, s, run);
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace mantissa::core::avx512
