// Reduced-precision scalar types and their conversions, one definition for host and device.
//
// Every conversion here is pure integer arithmetic on IEEE-754 bit patterns, so the CPU
// backend and the CUDA kernels produce bit-identical results from the same code. The FP8
// semantics follow CUDA's cuda_fp8.h exactly:
//   - FP32 -> FP8 rounds to nearest, ties to even;
//   - kSatFinite clamps overflow (and +-inf) to +-max finite, kNoSat gives NaN (E4M3, which
//     has no inf) or inf (E5M2);
//   - any NaN becomes the canonical NaN 0x7F (sign dropped, as CUDA does for float input).
// BF16 and FP16 follow __float2bfloat16_rn / __float2half_rn: round to nearest even,
// overflow to inf, NaN to the canonical 0x7FFF.
#pragma once

#include <cstdint>
#include <cstring>

#include "core/host_device.h"

namespace mantissa::core {

enum class Saturation : uint8_t { kSatFinite, kNoSat };

struct bf16 {
  uint16_t bits;
};
struct fp16 {
  uint16_t bits;
};
struct fp8_e4m3 {
  uint8_t bits;
};
struct fp8_e5m2 {
  uint8_t bits;
};

MANTISSA_HD uint32_t float_to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  return bits;
#endif
}

MANTISSA_HD float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float x;
  std::memcpy(&x, &bits, sizeof x);
  return x;
#endif
}

// The bits of FP32 +inf, which are also the exponent field's mask. Compared as unsigned
// integers, the bits of |x| lie above them exactly when x is a NaN.
constexpr uint32_t kF32InfBits = 0x7F800000u;

// Whether x is inf or NaN (its exponent field all ones), as an integer test: it vectorises,
// and no fast-math flag may assume it away.
MANTISSA_HD bool is_nonfinite_bits(float x) {
  return (float_to_bits(x) & kF32InfBits) == kF32InfBits;
}

// The bits of |x| (sign cleared) with every NaN made the canonical quiet NaN, so that a NaN
// amax reads back as the same value on the CPU and CUDA backends. Compared as unsigned
// integers these order like the magnitudes, NaN above inf: an integer max gives max |x|.
MANTISSA_HD uint32_t canonical_abs_bits(uint32_t abs_bits) {
  return abs_bits > kF32InfBits ? 0x7FC00000u : abs_bits;
}

// The amax that the bits of a largest |x| stand for.
MANTISSA_HD float amax_from_abs_bits(uint32_t abs_bits) {
  return bits_to_float(canonical_abs_bits(abs_bits));
}

// ---------------------------------------------------------------------------------------
// Counter-based random numbers: the value for (seed, index) never depends on how the work is
// split across threads, ranks or devices, which is what makes stochastic rounding
// reproducible.
//
// random_u32(seed, index) = h(h(lo ^ k.first) ^ k.second), where lo is the low 32 bits of the
// index and k = mix64(seed ^ mix64(hi + golden ratio)) is a 64-bit key for each run of 2^32
// indices (hi = index >> 32). h is hash32, a 32-bit xorshift-multiply hash (the two-multiply
// shape of Wellons' hash-prospector, constants found by TheIronBorn): a bijection in which
// flipping any input bit flips each output bit with probability close to 1/2.
//  - Cost: bulk code (the AVX2 loop, a GPU thread) derives the key once per run, so an element
//    costs four 32-bit multiplies. AVX2 multiplies eight 32-bit lanes at once but has no
//    64-bit multiply, and GPUs build 64-bit multiplies out of several 32-bit ones.
//  - Uniform: for a fixed key, lo -> value is a bijection, so over a run every value occurs
//    exactly once and the thresholds of stochastic rounding are uniform.
//  - Two rounds: neighbouring indices differ in a few low bits, which one round spreads over
//    the word, but one round leaves indices a power of two apart (a column of a matrix)
//    visibly dependent at some strides for every key; two rounds pass the same tests
//    (tests/core/test_dtype.cpp, RandomPairsAreIndependent).
//  - Seeds and runs reach the hash only through the key, which the murmur finaliser makes
//    look independent for neighbouring seeds or runs. Injecting half of it before each round
//    makes two keys give unrelated functions of lo, where a key xored in front alone would
//    make every seed's stream one sequence read at permuted indices (lo ^ constant).
MANTISSA_HD uint64_t mix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// The multipliers of hash32's two rounds (bulk CPU code computes hash32 in vector registers).
constexpr uint32_t kHash32Multiply1 = 0x21f0aaadu;
constexpr uint32_t kHash32Multiply2 = 0x735a2d97u;

MANTISSA_HD uint32_t hash32(uint32_t x) {
  x ^= x >> 16;
  x *= kHash32Multiply1;
  x ^= x >> 15;
  x *= kHash32Multiply2;
  x ^= x >> 15;
  return x;
}

struct RandomKey {
  uint32_t first;   // xored into the low index bits before the first round of hash32
  uint32_t second;  // and into the result before the second
};

// The key of the indices run * 2^32 + [0, 2^32).
MANTISSA_HD RandomKey random_key(uint64_t seed, uint32_t run) {
  const uint64_t k = mix64(seed ^ mix64(run + 0x9e3779b97f4a7c15ULL));
  return {static_cast<uint32_t>(k), static_cast<uint32_t>(k >> 32)};
}

// random_u32(seed, run * 2^32 + offset) given random_key(seed, run).
MANTISSA_HD uint32_t random_u32(RandomKey key, uint32_t offset) {
  return hash32(hash32(offset ^ key.first) ^ key.second);
}

MANTISSA_HD uint32_t random_u32(uint64_t seed, uint64_t index) {
  return random_u32(random_key(seed, static_cast<uint32_t>(index >> 32)),
                    static_cast<uint32_t>(index));
}

// random_u32(seed, index) for a sequence of indices that seldom leaves a run of 2^32 (the
// elements one GPU thread visits): the key is derived again only when the run changes.
class RandomStream {
 public:
  MANTISSA_HD explicit RandomStream(uint64_t seed)
      : seed_(seed), run_(0), key_(random_key(seed, 0)) {}

  MANTISSA_HD uint32_t operator()(uint64_t index) {
    const uint32_t run = static_cast<uint32_t>(index >> 32);
    if (run != run_) {
      run_ = run;
      key_ = random_key(seed_, run);
    }
    return random_u32(key_, static_cast<uint32_t>(index));
  }

 private:
  uint64_t seed_;
  uint32_t run_;
  RandomKey key_;
};

// ---------------------------------------------------------------------------------------
// Small binary formats with an implicit leading bit, described by their rounding boundaries
// as FP32 bit patterns (|x| compared as integers orders like |x| compared as reals).
struct SmallFloatFormat {
  int man_bits;                 // stored mantissa bits
  int bias;                     // exponent bias
  uint32_t underflow_max_bits;  // |x| <= this rounds to zero (half the smallest subnormal)
  uint32_t min_normal_bits;     // smallest normal magnitude
  uint32_t overflow_min_bits;   // |x| >= this is past max finite after rounding
  uint16_t max_finite_code;
  uint16_t overflow_code;  // result of an overflow without saturation (inf, or NaN for E4M3)
  uint16_t nan_code;
  int sign_shift;  // where the sign bit lives in the code
};

// E4M3 "fn": max 448; 464 (= 448 + half ulp) is a tie that rounds to even, i.e. down to 448.
MANTISSA_HD constexpr SmallFloatFormat e4m3_format() {
  return {3,
          7,
          0x3A800000u /*2^-10*/,
          0x3C800000u /*2^-6*/,
          0x43E80001u /*just past 464*/,
          0x7E,
          0x7F,
          0x7F,
          7};
}
// E5M2: max 57344; 61440 (= max + half ulp) ties to even, which is upward, so it overflows.
MANTISSA_HD constexpr SmallFloatFormat e5m2_format() {
  return {2,    15, 0x37000000u /*2^-17*/, 0x38800000u /*2^-14*/, 0x47700000u /*61440*/, 0x7B, 0x7C,
          0x7F, 7};
}
// FP16: max 65504; 65520 ties upward to 65536, i.e. inf.
MANTISSA_HD constexpr SmallFloatFormat fp16_format() {
  return {10,
          15,
          0x33000000u /*2^-25*/,
          0x38800000u /*2^-14*/,
          0x477FF000u /*65520*/,
          0x7BFF,
          0x7C00,
          0x7FFF,
          15};
}

// Round |x| (finite, below the overflow bound, above the underflow bound) to the nearest
// code with ties to even. Shared by the normal and subnormal ranges: a subnormal is a normal
// significand (with its implicit bit made explicit) shifted further right.
MANTISSA_HD uint32_t round_magnitude_rne(uint32_t abs_bits, SmallFloatFormat f) {
  const int drop = 23 - f.man_bits;  // FP32 mantissa bits that do not fit
  const uint32_t half = 1u << (drop - 1);
  const int exponent = static_cast<int>(abs_bits >> 23) - 127 + f.bias;
  if (abs_bits >= f.min_normal_bits) {
    uint32_t code = (static_cast<uint32_t>(exponent) << f.man_bits) |
                    ((abs_bits >> drop) & ((1u << f.man_bits) - 1));
    const uint32_t rest = abs_bits & ((half << 1) - 1);
    if (rest > half || (rest == half && (code & 1u))) ++code;  // a carry bumps the exponent
    return code;
  }
  const int shift = 1 - exponent;  // extra right shift into the subnormal range
  const uint32_t significand = (abs_bits & 0x007FFFFFu) | 0x00800000u;
  uint32_t code = (significand >> drop) >> shift;
  const uint32_t rest = significand & ((half << (shift + 1)) - 1);
  const uint32_t tie = half << shift;
  if (rest > tie || (rest == tie && (code & 1u))) ++code;
  return code;
}

MANTISSA_HD uint16_t float_to_small_rne(float x, SmallFloatFormat f, Saturation sat) {
  const uint32_t bits = float_to_bits(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return f.nan_code;
  const uint32_t sign = (bits >> 31) << f.sign_shift;
  if (abs_bits <= f.underflow_max_bits) return static_cast<uint16_t>(sign);
  if (abs_bits >= f.overflow_min_bits) {
    return static_cast<uint16_t>(
        sign | (sat == Saturation::kSatFinite ? f.max_finite_code : f.overflow_code));
  }
  return static_cast<uint16_t>(sign | round_magnitude_rne(abs_bits, f));
}

// Decode a code of a small format exactly (every such value is an FP32 value).
MANTISSA_HD float small_to_float(uint32_t code, SmallFloatFormat f, bool has_inf) {
  const uint32_t sign = (code >> f.sign_shift) & 1u;
  const uint32_t magnitude = code & ((1u << f.sign_shift) - 1);
  const uint32_t exp_field = magnitude >> f.man_bits;
  const uint32_t man = magnitude & ((1u << f.man_bits) - 1);
  const uint32_t exp_all_ones = (1u << (f.sign_shift - f.man_bits)) - 1;
  uint32_t out;
  if (has_inf && exp_field == exp_all_ones) {
    out = man == 0 ? 0x7F800000u : 0x7FFFFFFFu;
  } else if (!has_inf && magnitude == f.nan_code) {
    out = 0x7FFFFFFFu;
  } else if (exp_field == 0) {
    // Subnormal: man * 2^(1 - bias - man_bits), exact in FP32 for every format here.
    const float scale = bits_to_float(static_cast<uint32_t>(127 + 1 - f.bias - f.man_bits) << 23);
    out = float_to_bits(static_cast<float>(man) * scale);
  } else {
    out = ((exp_field - f.bias + 127) << 23) | (man << (23 - f.man_bits));
  }
  return bits_to_float(out | (sign << 31));
}

// Stochastic rounding between the two neighbouring codes: round away from zero with
// probability (|x| - lo) / (hi - lo), so the expected result is x. Values outside the finite
// range (and NaN) take the deterministic path.
MANTISSA_HD uint16_t float_to_small_stochastic(float x, uint32_t random, SmallFloatFormat f,
                                               bool has_inf, Saturation sat) {
  const uint32_t bits = float_to_bits(x);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  const float max_finite = small_to_float(f.max_finite_code, f, has_inf);
  if (abs_bits > float_to_bits(max_finite)) return float_to_small_rne(x, f, sat);
  const uint32_t sign = (bits >> 31) << f.sign_shift;
  const float magnitude = bits_to_float(abs_bits);
  // Truncation toward zero: the RNE code, stepped back when it rounded up.
  uint32_t lo = abs_bits <= f.underflow_max_bits ? 0u : round_magnitude_rne(abs_bits, f);
  if (small_to_float(lo, f, has_inf) > magnitude) --lo;
  const float lo_value = small_to_float(lo, f, has_inf);
  if (lo_value == magnitude || lo == f.max_finite_code) return static_cast<uint16_t>(sign | lo);
  const float hi_value = small_to_float(lo + 1, f, has_inf);
  // random / 2^32 is uniform in [0, 1) on a grid finer than any gap between neighbours.
  const float u = static_cast<float>(random >> 8) * (1.0f / 16777216.0f);
  const bool up = u * (hi_value - lo_value) < magnitude - lo_value;
  return static_cast<uint16_t>(sign | (lo + (up ? 1u : 0u)));
}

// ---------------------------------------------------------------------------------------
// BF16: the top half of an FP32 pattern.
MANTISSA_HD bf16 bf16_from_float(float x) {
  const uint32_t bits = float_to_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return bf16{0x7FFF};
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest with ties to even; a carry out of
  // the mantissa correctly bumps the exponent (and the largest finite values round to inf).
  return bf16{static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16)};
}

// Rounds up with probability (dropped 16 bits) / 2^16, using the top 16 bits of `random`.
MANTISSA_HD bf16 bf16_from_float_stochastic(float x, uint32_t random) {
  const uint32_t bits = float_to_bits(x);
  if ((bits & 0x7F800000u) == 0x7F800000u) return bf16_from_float(x);
  const uint32_t dropped = bits & 0xFFFFu;
  const uint32_t threshold = random >> 16;
  const uint32_t kept = bits >> 16;
  return bf16{static_cast<uint16_t>(dropped > threshold ? kept + 1 : kept)};
}

MANTISSA_HD float bf16_to_float(bf16 x) {
  return bits_to_float(static_cast<uint32_t>(x.bits) << 16);
}

MANTISSA_HD fp16 fp16_from_float(float x) {
  return fp16{float_to_small_rne(x, fp16_format(), Saturation::kNoSat)};
}
MANTISSA_HD float fp16_to_float(fp16 x) {
  return small_to_float(x.bits, fp16_format(), true);
}

MANTISSA_HD fp8_e4m3 e4m3_from_float(float x, Saturation sat = Saturation::kSatFinite) {
  return fp8_e4m3{static_cast<uint8_t>(float_to_small_rne(x, e4m3_format(), sat))};
}
MANTISSA_HD fp8_e4m3 e4m3_from_float_stochastic(float x, uint32_t random,
                                                Saturation sat = Saturation::kSatFinite) {
  return fp8_e4m3{
      static_cast<uint8_t>(float_to_small_stochastic(x, random, e4m3_format(), false, sat))};
}
MANTISSA_HD float e4m3_to_float(fp8_e4m3 x) {
  return small_to_float(x.bits, e4m3_format(), false);
}

MANTISSA_HD fp8_e5m2 e5m2_from_float(float x, Saturation sat = Saturation::kSatFinite) {
  return fp8_e5m2{static_cast<uint8_t>(float_to_small_rne(x, e5m2_format(), sat))};
}
MANTISSA_HD fp8_e5m2 e5m2_from_float_stochastic(float x, uint32_t random,
                                                Saturation sat = Saturation::kSatFinite) {
  return fp8_e5m2{
      static_cast<uint8_t>(float_to_small_stochastic(x, random, e5m2_format(), true, sat))};
}
MANTISSA_HD float e5m2_to_float(fp8_e5m2 x) {
  return small_to_float(x.bits, e5m2_format(), true);
}

// ---------------------------------------------------------------------------------------
// Uniform spelling for templated kernels: to_float(T) and round_to<T>(float, saturation).
MANTISSA_HD float to_float(float x) {
  return x;
}
MANTISSA_HD float to_float(bf16 x) {
  return bf16_to_float(x);
}
MANTISSA_HD float to_float(fp16 x) {
  return fp16_to_float(x);
}
MANTISSA_HD float to_float(fp8_e4m3 x) {
  return e4m3_to_float(x);
}
MANTISSA_HD float to_float(fp8_e5m2 x) {
  return e5m2_to_float(x);
}

template <class T>
struct Rounder;
template <>
struct Rounder<float> {
  static MANTISSA_HD float nearest(float x, Saturation) { return x; }
  static MANTISSA_HD float stochastic(float x, uint32_t, Saturation) { return x; }
};
template <>
struct Rounder<bf16> {
  static MANTISSA_HD bf16 nearest(float x, Saturation) { return bf16_from_float(x); }
  static MANTISSA_HD bf16 stochastic(float x, uint32_t r, Saturation) {
    return bf16_from_float_stochastic(x, r);
  }
};
template <>
struct Rounder<fp16> {
  static MANTISSA_HD fp16 nearest(float x, Saturation) { return fp16_from_float(x); }
  static MANTISSA_HD fp16 stochastic(float x, uint32_t r, Saturation) {
    return fp16{float_to_small_stochastic(x, r, fp16_format(), true, Saturation::kNoSat)};
  }
};
template <>
struct Rounder<fp8_e4m3> {
  static MANTISSA_HD fp8_e4m3 nearest(float x, Saturation s) { return e4m3_from_float(x, s); }
  static MANTISSA_HD fp8_e4m3 stochastic(float x, uint32_t r, Saturation s) {
    return e4m3_from_float_stochastic(x, r, s);
  }
};
template <>
struct Rounder<fp8_e5m2> {
  static MANTISSA_HD fp8_e5m2 nearest(float x, Saturation s) { return e5m2_from_float(x, s); }
  static MANTISSA_HD fp8_e5m2 stochastic(float x, uint32_t r, Saturation s) {
    return e5m2_from_float_stochastic(x, r, s);
  }
};

template <class T>
MANTISSA_HD T round_to(float x, Saturation sat = Saturation::kSatFinite) {
  return Rounder<T>::nearest(x, sat);
}

}  // namespace mantissa::core
