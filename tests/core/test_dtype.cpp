// The scalar conversions of core/dtype/dtype.h against references written from the format
// definitions alone (the OCP 8-bit floating point specification, IEEE 754 binary16, bfloat16;
// CUDA's __nv_cvt_double_to_fp8):
//  - decoding: a sign/exponent/mantissa decoder in FP64 (std::ldexp), checked on every code;
//  - encoding: the nearest representable value found by trying every code (ties to the even
//    code), overflow handled by each format's saturation rule;
//  - stochastic rounding: only the two neighbours, unbiased on average, reproducible;
//  - its random numbers: random_u32 against its definition written out, and statistical
//    tests of uniformity and independence with fixed seeds.
// No expected value here comes from dtype.h.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype/dtype.h"

namespace mantissa::core {
namespace {

// --- reference formats -------------------------------------------------------------------

// A binary format with 1 sign bit, exp_bits and man_bits: (-1)^s 2^(e - bias) 1.m for e > 0
// and (-1)^s 2^(1 - bias) 0.m for e = 0. With IEEE specials the all-ones exponent holds inf
// (mantissa 0) and NaN; E4M3 "fn" uses that exponent for finite values, keeps only the
// magnitude S.1111.111 for NaN, and has no inf.
struct RefFormat {
  const char* name;
  int exp_bits;
  int man_bits;
  int bias;
  bool ieee_specials;
  uint32_t canonical_nan;  // the code every NaN input becomes
  bool saturates;          // FP8: Saturation decides overflow; BF16/FP16 always give inf

  int bits() const { return 1 + exp_bits + man_bits; }
  uint32_t sign_bit() const { return 1u << (exp_bits + man_bits); }
  uint32_t exp_all_ones() const { return (1u << exp_bits) - 1; }
  uint32_t man_all_ones() const { return (1u << man_bits) - 1; }
  // The largest finite magnitude: one below the all-ones exponent for IEEE formats, the
  // all-ones exponent with mantissa 110 for E4M3fn.
  uint32_t max_finite_code() const {
    return ieee_specials ? (exp_all_ones() << man_bits) - 1
                         : (exp_all_ones() << man_bits) | (man_all_ones() - 1);
  }
};

constexpr RefFormat kBF16{"bf16", 8, 7, 127, true, 0x7FFF, false};
constexpr RefFormat kFP16{"fp16", 5, 10, 15, true, 0x7FFF, false};
constexpr RefFormat kE4M3{"e4m3", 4, 3, 7, false, 0x7F, true};
constexpr RefFormat kE5M2{"e5m2", 5, 2, 15, true, 0x7F, true};

double ref_decode(uint32_t code, const RefFormat& f) {
  const bool negative = (code & f.sign_bit()) != 0;
  const uint32_t e = (code >> f.man_bits) & f.exp_all_ones();
  const uint32_t m = code & f.man_all_ones();
  double magnitude;
  if (f.ieee_specials && e == f.exp_all_ones()) {
    magnitude = m == 0 ? INFINITY : NAN;
  } else if (!f.ieee_specials && e == f.exp_all_ones() && m == f.man_all_ones()) {
    magnitude = NAN;
  } else if (e == 0) {
    magnitude = std::ldexp(static_cast<double>(m), 1 - f.bias - f.man_bits);
  } else {
    magnitude = std::ldexp(static_cast<double>((1u << f.man_bits) + m),
                           static_cast<int>(e) - f.bias - f.man_bits);
  }
  return negative ? -magnitude : magnitude;
}

// What the reference encoders search: every code decoded, and the non-negative finite values
// sorted with their codes. The sorted table ends with the step past the largest finite value
// (code max + 1), which an unbounded exponent range would have next: rounding to it is an
// overflow.
struct Reference {
  RefFormat f;
  std::vector<double> by_code;  // ref_decode(code) for every code
  std::vector<double> sorted_values;
  std::vector<uint32_t> sorted_codes;
  double max_finite;
  double past_max;
};

Reference make_reference(const RefFormat& f) {
  Reference r{f, {}, {}, {}, 0.0, 0.0};
  for (uint32_t code = 0; code < (1u << f.bits()); ++code) r.by_code.push_back(ref_decode(code, f));
  std::vector<std::pair<double, uint32_t>> table;
  for (uint32_t code = 0; code < f.sign_bit(); ++code) {
    if (std::isfinite(r.by_code[code])) table.emplace_back(r.by_code[code], code);
  }
  std::sort(table.begin(), table.end());
  r.max_finite = table.back().first;
  r.past_max = r.max_finite + (r.max_finite - table[table.size() - 2].first);
  table.emplace_back(r.past_max, table.back().second + 1);
  for (const auto& [value, code] : table) {
    r.sorted_values.push_back(value);
    r.sorted_codes.push_back(code);
  }
  return r;
}

// The code an overflowing value of the given sign becomes.
uint32_t overflow_code(const RefFormat& f, uint32_t sign, Saturation sat) {
  if (f.saturates && sat == Saturation::kSatFinite) return sign | f.max_finite_code();
  if (f.ieee_specials) return sign | (f.exp_all_ones() << f.man_bits);  // inf
  return sign | (f.sign_bit() - 1);  // E4M3 has no inf: NaN, sign kept as CUDA keeps it
}

// The encoding of x given the magnitude code nearest to |x|, ties to even, chosen among the
// finite codes and the step past the largest one.
uint32_t finish_encoding(float x, uint32_t nearest, const RefFormat& f, Saturation sat) {
  const uint32_t sign = std::signbit(x) ? f.sign_bit() : 0;
  if (nearest > f.max_finite_code()) return overflow_code(f, sign, sat);
  return sign | nearest;
}

// Brute force: every code of x's sign is tried and the nearest kept (an even code wins a
// tie). |x| at or beyond the step past max overflows outright: FP64 distances to the codes
// would not be exact out there, and no code is nearer anyway.
uint32_t encode_by_linear_search(float x, const Reference& r, Saturation sat) {
  const RefFormat& f = r.f;
  if (std::isnan(x)) return f.canonical_nan;
  const uint32_t sign = std::signbit(x) ? f.sign_bit() : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= r.past_max) return overflow_code(f, sign, sat);
  uint32_t best = 0;
  double best_distance = INFINITY;
  for (uint32_t magnitude = 0; magnitude < f.sign_bit(); ++magnitude) {
    const double value = std::fabs(r.by_code[sign | magnitude]);
    if (!std::isfinite(value)) continue;
    const double d = std::fabs(value - a);
    if (d < best_distance || (d == best_distance && (magnitude & 1u) == 0)) {
      best = magnitude;
      best_distance = d;
    }
  }
  const uint32_t past_max_code = f.max_finite_code() + 1;
  const double d = r.past_max - a;
  if (d < best_distance || (d == best_distance && (past_max_code & 1u) == 0)) {
    best = past_max_code;
  }
  return finish_encoding(x, best, f, sat);
}

// The same rounding with a binary search in the sorted table: the two values around |x|.
uint32_t encode_by_binary_search(float x, const Reference& r, Saturation sat) {
  const RefFormat& f = r.f;
  if (std::isnan(x)) return f.canonical_nan;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= r.past_max) return overflow_code(f, std::signbit(x) ? f.sign_bit() : 0, sat);
  const size_t hi =
      static_cast<size_t>(std::lower_bound(r.sorted_values.begin(), r.sorted_values.end(), a) -
                          r.sorted_values.begin());
  if (r.sorted_values[hi] == a || hi == 0) return finish_encoding(x, r.sorted_codes[hi], f, sat);
  const double below = a - r.sorted_values[hi - 1];
  const double above = r.sorted_values[hi] - a;
  const bool take_hi = above < below || (above == below && (r.sorted_codes[hi] & 1u) == 0);
  return finish_encoding(x, r.sorted_codes[take_hi ? hi : hi - 1], f, sat);
}

// --- the functions under test ----------------------------------------------------------------

struct Subject {
  RefFormat f;
  float (*decode)(uint32_t code);
  uint32_t (*encode)(float x, Saturation sat);
  uint32_t (*encode_stochastic)(float x, uint32_t random, Saturation sat);
};

const Subject kSubjects[] = {
    {kBF16, [](uint32_t c) { return bf16_to_float(bf16{static_cast<uint16_t>(c)}); },
     [](float x, Saturation) -> uint32_t { return bf16_from_float(x).bits; },
     [](float x, uint32_t r, Saturation) -> uint32_t {
       return bf16_from_float_stochastic(x, r).bits;
     }},
    {kFP16, [](uint32_t c) { return fp16_to_float(fp16{static_cast<uint16_t>(c)}); },
     [](float x, Saturation) -> uint32_t { return fp16_from_float(x).bits; },
     [](float x, uint32_t r, Saturation s) -> uint32_t {
       return Rounder<fp16>::stochastic(x, r, s).bits;
     }},
    {kE4M3, [](uint32_t c) { return e4m3_to_float(fp8_e4m3{static_cast<uint8_t>(c)}); },
     [](float x, Saturation s) -> uint32_t { return e4m3_from_float(x, s).bits; },
     [](float x, uint32_t r, Saturation s) -> uint32_t {
       return e4m3_from_float_stochastic(x, r, s).bits;
     }},
    {kE5M2, [](uint32_t c) { return e5m2_to_float(fp8_e5m2{static_cast<uint8_t>(c)}); },
     [](float x, Saturation s) -> uint32_t { return e5m2_from_float(x, s).bits; },
     [](float x, uint32_t r, Saturation s) -> uint32_t {
       return e5m2_from_float_stochastic(x, r, s).bits;
     }},
};

const Reference& reference(const RefFormat& f) {
  static const std::vector<Reference> all = {make_reference(kBF16), make_reference(kFP16),
                                             make_reference(kE4M3), make_reference(kE5M2)};
  for (const Reference& r : all) {
    if (std::string(r.f.name) == f.name) return r;
  }
  std::abort();
}

const Subject& subject(const RefFormat& f) {
  for (const Subject& s : kSubjects) {
    if (std::string(s.f.name) == f.name) return s;
  }
  std::abort();
}

std::string hex(uint32_t bits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%X", bits);
  return text;
}

std::string describe(float x) {
  char text[64];
  std::snprintf(text, sizeof text, "%.9g (0x%08X)", static_cast<double>(x),
                std::bit_cast<uint32_t>(x));
  return text;
}

// Counts mismatches of a bulk check and reports the first few in one failure.
class Mismatches {
 public:
  void add(const std::string& detail) {
    if (count_++ < 8) details_ += "  " + detail + "\n";
  }
  void expect_none(const std::string& what) const {
    EXPECT_EQ(count_, 0u) << what << ": " << count_ << " mismatches, first ones:\n" << details_;
  }

 private:
  size_t count_ = 0;
  std::string details_;
};

// --- decoding --------------------------------------------------------------------------------

// The reference decoder reproduces the formats' published tables (largest, smallest normal and
// subnormal values), so it is the format we mean.
TEST(Dtype, ReferenceDecoderMatchesFormatTable) {
  struct Row {
    RefFormat f;
    double max_finite, min_normal, min_subnormal;
  };
  const Row rows[] = {{kBF16, 0x1.FEp127, 0x1p-126, 0x1p-133},
                      {kFP16, 65504.0, 0x1p-14, 0x1p-24},
                      {kE4M3, 448.0, 0x1p-6, 0x1p-9},
                      {kE5M2, 57344.0, 0x1p-14, 0x1p-16}};
  for (const Row& row : rows) {
    SCOPED_TRACE(row.f.name);
    EXPECT_EQ(ref_decode(row.f.max_finite_code(), row.f), row.max_finite);
    EXPECT_EQ(ref_decode(1u << row.f.man_bits, row.f), row.min_normal);
    EXPECT_EQ(ref_decode(1, row.f), row.min_subnormal);
    EXPECT_EQ(reference(row.f).max_finite, row.max_finite);
  }
  EXPECT_EQ(kE4M3.max_finite_code(), 0x7Eu);
  EXPECT_EQ(kE5M2.max_finite_code(), 0x7Bu);
  // E4M3fn: 0x7F/0xFF are the only NaNs and there is no inf.
  int e4m3_nans = 0;
  for (uint32_t c = 0; c < 256; ++c) {
    EXPECT_FALSE(std::isinf(ref_decode(c, kE4M3)));
    e4m3_nans += std::isnan(ref_decode(c, kE4M3));
  }
  EXPECT_EQ(e4m3_nans, 2);
  EXPECT_TRUE(std::isnan(ref_decode(0x7F, kE4M3)) && std::isnan(ref_decode(0xFF, kE4M3)));
  // E5M2: S.11111.00 is inf, S.11111.{01,10,11} NaN.
  EXPECT_EQ(ref_decode(0x7C, kE5M2), INFINITY);
  EXPECT_EQ(ref_decode(0xFC, kE5M2), -INFINITY);
  for (uint32_t c : {0x7Du, 0x7Eu, 0x7Fu, 0xFDu, 0xFEu, 0xFFu}) {
    EXPECT_TRUE(std::isnan(ref_decode(c, kE5M2))) << hex(c);
  }
}

TEST(Dtype, DecodesEveryCode) {
  for (const Subject& s : kSubjects) {
    const Reference& r = reference(s.f);
    Mismatches mismatches;
    for (uint32_t code = 0; code < r.by_code.size(); ++code) {
      const double want = r.by_code[code];
      const float got = s.decode(code);
      const bool same = std::isnan(want) ? std::isnan(got)
                                         : static_cast<double>(got) == want &&
                                               std::signbit(got) == std::signbit(want);
      if (!same) {
        mismatches.add(hex(code) + " decodes to " + describe(got) + ", reference " +
                       std::to_string(want));
      }
    }
    mismatches.expect_none(std::string(s.f.name) + " decode");
  }
}

// --- encoding: boundaries --------------------------------------------------------------------

struct Boundary {
  float x;
  uint32_t satfinite;  // expected code with kSatFinite (and for BF16/FP16, which ignore it)
  uint32_t nosat;      // expected code with kNoSat
};

void check_boundaries(const RefFormat& f, const std::vector<Boundary>& cases) {
  const Subject& s = subject(f);
  for (const Boundary& c : cases) {
    EXPECT_EQ(hex(s.encode(c.x, Saturation::kSatFinite)), hex(c.satfinite))
        << f.name << " satfinite of " << describe(c.x);
    EXPECT_EQ(hex(s.encode(c.x, Saturation::kNoSat)), hex(c.nosat))
        << f.name << " nosat of " << describe(c.x);
    // The references agree with these hand-derived codes.
    const Reference& r = reference(f);
    EXPECT_EQ(hex(encode_by_linear_search(c.x, r, Saturation::kSatFinite)), hex(c.satfinite))
        << "reference " << f.name << " satfinite of " << describe(c.x);
    EXPECT_EQ(hex(encode_by_binary_search(c.x, r, Saturation::kNoSat)), hex(c.nosat))
        << "reference " << f.name << " nosat of " << describe(c.x);
  }
}

float up(float x) {
  return std::nextafter(x, INFINITY);
}
float down(float x) {
  return std::nextafter(x, -INFINITY);
}
float bits(uint32_t b) {
  return std::bit_cast<float>(b);
}

const float kNaNs[] = {
    NAN, -NAN, bits(0x7F800001u), bits(0xFF800001u), bits(0x7FFFFFFFu), bits(0xFFFFFFFFu)};
const float kFltMax = std::numeric_limits<float>::max();
const float kFltDenormMin = std::numeric_limits<float>::denorm_min();

TEST(Dtype, EncodesE4M3Boundaries) {
  std::vector<Boundary> cases = {
      {0.0f, 0x00, 0x00},
      {-0.0f, 0x80, 0x80},
      {kFltDenormMin, 0x00, 0x00},  // FP32 subnormal underflows to a signed zero
      {-kFltDenormMin, 0x80, 0x80},
      {0x1p-9f, 0x01, 0x01},  // smallest subnormal
      {-0x1p-9f, 0x81, 0x81},
      {0x1p-10f, 0x00, 0x00},  // half of it: a tie, to the even code 0
      {-0x1p-10f, 0x80, 0x80},
      {up(0x1p-10f), 0x01, 0x01},
      {0x1.8p-9f, 0x02, 0x02},  // 1.5 steps: tie between 1 and 2 -> 2
      {0x1.4p-8f, 0x02, 0x02},  // 2.5 steps: tie between 2 and 3 -> 2
      {0x1.Cp-8f, 0x04, 0x04},  // 3.5 steps -> 4
      {0x1.Cp-7f, 0x07, 0x07},  // largest subnormal, 7 steps
      {0x1.Ep-7f, 0x08, 0x08},  // 7.5 steps: tie between 7 and the smallest normal -> 8
      {0x1p-6f, 0x08, 0x08},    // smallest normal
      {1.0f, 0x38, 0x38},
      {1.0625f, 0x38, 0x38},  // tie between 1 and 1.125 -> 1 (even)
      {1.1875f, 0x3A, 0x3A},  // tie between 1.125 and 1.25 -> 1.25 (even)
      {down(1.1875f), 0x39, 0x39},
      {-240.0f, 0xF7, 0xF7},
      {448.0f, 0x7E, 0x7E},  // max finite
      {-448.0f, 0xFE, 0xFE},
      {460.0f, 0x7E, 0x7E},
      {464.0f, 0x7E, 0x7E},  // max + half ulp: tie, and max's mantissa 110 is even
      {-464.0f, 0xFE, 0xFE},
      {up(464.0f), 0x7E, 0x7F},  // past the tie: overflow (NaN without saturation)
      {465.0f, 0x7E, 0x7F},
      {-465.0f, 0xFE, 0xFF},
      {1e30f, 0x7E, 0x7F},
      {kFltMax, 0x7E, 0x7F},
      {INFINITY, 0x7E, 0x7F},
      {-INFINITY, 0xFE, 0xFF},
  };
  for (float nan : kNaNs) cases.push_back({nan, 0x7F, 0x7F});
  check_boundaries(kE4M3, cases);
}

TEST(Dtype, EncodesE5M2Boundaries) {
  std::vector<Boundary> cases = {
      {0.0f, 0x00, 0x00},  // zeros keep their sign
      {-0.0f, 0x80, 0x80},
      {-kFltDenormMin, 0x80, 0x80},  // FP32 subnormal underflows to a signed zero
      {0x1p-16f, 0x01, 0x01},        // smallest subnormal
      {0x1p-17f, 0x00, 0x00},        // half of it: tie to 0
      {-0x1p-17f, 0x80, 0x80},
      {up(0x1p-17f), 0x01, 0x01},  // just past the tie
      {0x1.8p-16f, 0x02, 0x02},    // tie between 1 and 2 steps -> 2
      {0x1.4p-15f, 0x02, 0x02},    // tie between 2 and 3 -> 2
      {0x1.Cp-15f, 0x04, 0x04},    // 3.5 steps: tie with the smallest normal -> 4
      {0x1p-14f, 0x04, 0x04},      // smallest normal
      {1.0f, 0x3C, 0x3C},          // 0.01111.00
      {1.125f, 0x3C, 0x3C},        // tie between 1 and 1.25 -> 1
      {1.375f, 0x3E, 0x3E},        // tie between 1.25 and 1.5 -> 1.5
      {1.625f, 0x3E, 0x3E},        // tie between 1.5 and 1.75 -> 1.5
      {53248.0f, 0x7A, 0x7A},      // tie between 49152 and 57344 -> 49152 (even)
      {57344.0f, 0x7B, 0x7B},      // max finite
      {-57344.0f, 0xFB, 0xFB},
      {down(61440.0f), 0x7B, 0x7B},  // just below the overflow tie
      {61440.0f, 0x7B, 0x7C},        // max + half ulp: tie, to the even step past max: overflow
      {-61440.0f, 0xFB, 0xFC},
      {1e30f, 0x7B, 0x7C},  // far past max
      {kFltMax, 0x7B, 0x7C},
      {INFINITY, 0x7B, 0x7C},  // inf saturates to max, or stays inf
      {-INFINITY, 0xFB, 0xFC},
  };
  for (float nan : kNaNs) cases.push_back({nan, 0x7F, 0x7F});
  check_boundaries(kE5M2, cases);
}

TEST(Dtype, EncodesFP16Boundaries) {
  std::vector<Boundary> cases = {
      {0.0f, 0x0000, 0x0000},
      {-0.0f, 0x8000, 0x8000},
      {-kFltDenormMin, 0x8000, 0x8000},
      {0x1p-24f, 0x0001, 0x0001},  // smallest subnormal
      {0x1p-25f, 0x0000, 0x0000},  // half of it: tie to 0
      {-0x1p-25f, 0x8000, 0x8000},
      {up(0x1p-25f), 0x0001, 0x0001},
      {0x1.8p-24f, 0x0002, 0x0002},    // tie between 1 and 2 steps -> 2
      {0x1.FFCp-15f, 0x0400, 0x0400},  // 1023.5 steps: tie with the smallest normal -> 1024
      {0x1p-14f, 0x0400, 0x0400},      // smallest normal
      {1.0f, 0x3C00, 0x3C00},
      {1.0f + 0x1p-11f, 0x3C00, 0x3C00},    // tie -> even
      {1.0f + 0x1.8p-10f, 0x3C02, 0x3C02},  // tie between 0x3C01 and 0x3C02 -> 0x3C02
      {up(1.0f + 0x1p-11f), 0x3C01, 0x3C01},
      {65504.0f, 0x7BFF, 0x7BFF},  // max finite
      {down(65520.0f), 0x7BFF, 0x7BFF},
      {65520.0f, 0x7C00, 0x7C00},  // max + half ulp: tie to the even step past max: inf
      {-65520.0f, 0xFC00, 0xFC00},
      {kFltMax, 0x7C00, 0x7C00},
      {INFINITY, 0x7C00, 0x7C00},
      {-INFINITY, 0xFC00, 0xFC00},
  };
  for (float nan : kNaNs) cases.push_back({nan, 0x7FFF, 0x7FFF});
  check_boundaries(kFP16, cases);
}

TEST(Dtype, EncodesBF16Boundaries) {
  std::vector<Boundary> cases = {
      {0.0f, 0x0000, 0x0000},
      {-0.0f, 0x8000, 0x8000},
      {0x1p-133f, 0x0001, 0x0001},  // smallest subnormal
      {0x1p-134f, 0x0000, 0x0000},  // half of it: tie to 0
      {-0x1p-134f, 0x8000, 0x8000},
      {up(0x1p-134f), 0x0001, 0x0001},
      {0x1.8p-133f, 0x0002, 0x0002},  // tie between 1 and 2 steps -> 2
      {0x1p-126f, 0x0080, 0x0080},    // smallest normal
      {1.0f, 0x3F80, 0x3F80},
      {1.0f + 0x1p-8f, 0x3F80, 0x3F80},    // tie -> even
      {1.0f + 0x1.8p-7f, 0x3F82, 0x3F82},  // tie between 0x3F81 and 0x3F82 -> 0x3F82
      {up(1.0f + 0x1p-8f), 0x3F81, 0x3F81},
      {-3.0f, 0xC040, 0xC040},
      {0x1.FEp127f, 0x7F7F, 0x7F7F},  // max finite
      {down(0x1.FFp127f), 0x7F7F, 0x7F7F},
      {0x1.FFp127f, 0x7F80, 0x7F80},  // max + half ulp: tie to the even step past max: inf
      {-0x1.FFp127f, 0xFF80, 0xFF80},
      {kFltMax, 0x7F80, 0x7F80},
      {-kFltMax, 0xFF80, 0xFF80},
      {INFINITY, 0x7F80, 0x7F80},
      {-INFINITY, 0xFF80, 0xFF80},
  };
  // Every NaN, signalling ones included, stays NaN: 0x7FFF, never rounded into inf.
  for (float nan : kNaNs) cases.push_back({nan, 0x7FFF, 0x7FFF});
  check_boundaries(kBF16, cases);
}

// --- encoding: random values against brute force -------------------------------------------

// A mix that reaches every rounding path of format f: arbitrary FP32 bit patterns (NaNs,
// infinities, FP32 subnormals, far out of range), values spread over f's exponent range with
// random mantissas, exact midpoints between neighbouring values (ties, including the one at
// max + half ulp) and the FP32 values just beside them, and exactly representable values.
std::vector<float> random_inputs(const Reference& r, size_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const int lowest_exponent = 1 - r.f.bias - r.f.man_bits - 2;
  const int highest_exponent = std::ilogb(r.max_finite) + 2;
  std::uniform_int_distribution<int> exponent(lowest_exponent, highest_exponent);
  std::uniform_int_distribution<size_t> pair(0, r.sorted_values.size() - 2);
  std::vector<float> out(n);
  for (float& x : out) {
    const double sign = (rng() & 1) ? -1.0 : 1.0;
    const size_t k = pair(rng);
    const double midpoint = (r.sorted_values[k] + r.sorted_values[k + 1]) / 2;
    switch (rng() % 8) {
      case 0:
      case 1: x = bits(static_cast<uint32_t>(rng())); break;
      case 2:
      case 3:
      case 4: {
        const double mantissa = 1.0 + std::ldexp(static_cast<double>(rng() >> 41), -23);
        x = static_cast<float>(sign * std::ldexp(mantissa, exponent(rng)));
        break;
      }
      case 5: x = static_cast<float>(sign * midpoint); break;
      case 6: {
        const float m = static_cast<float>(sign * midpoint);
        x = (rng() & 1) ? up(m) : down(m);
        break;
      }
      default: x = static_cast<float>(sign * r.sorted_values[k]); break;
    }
  }
  return out;
}

// Every value of format f, every midpoint between neighbours (the ties, up to the one between
// max and the step past it) and the FP32 values just beside each, with both signs: the
// inputs where rounding decides, none left to chance.
std::vector<float> every_value_and_midpoint(const Reference& r) {
  std::vector<float> out;
  for (size_t k = 0; k + 1 < r.sorted_values.size(); ++k) {
    const float value = static_cast<float>(r.sorted_values[k]);
    const float midpoint = static_cast<float>((r.sorted_values[k] + r.sorted_values[k + 1]) / 2);
    for (float x : {value, midpoint, up(midpoint), down(midpoint)}) {
      out.push_back(x);
      out.push_back(-x);
    }
  }
  return out;
}

// Every input's expected code from `reference_encode`, computed on all threads.
template <class Encode>
std::vector<uint32_t> expected_codes(const std::vector<float>& inputs, Saturation sat,
                                     const Encode& reference_encode) {
  std::vector<uint32_t> out(inputs.size());
#pragma omp parallel for schedule(dynamic, 256)
  for (size_t i = 0; i < inputs.size(); ++i) out[i] = reference_encode(inputs[i], sat);
  return out;
}

// Compares the encoding of every input, in both saturation modes, with the reference, and
// returns the reference codes for kNoSat. BF16 and FP16 have no saturation mode (overflow is
// inf), so their reference runs once.
template <class Encode>
std::vector<uint32_t> check_encoding(const Subject& s, const std::vector<float>& inputs,
                                     const Encode& reference_encode, const std::string& what) {
  std::vector<uint32_t> want;
  for (Saturation sat : {Saturation::kSatFinite, Saturation::kNoSat}) {
    if (want.empty() || s.f.saturates) want = expected_codes(inputs, sat, reference_encode);
    Mismatches mismatches;
    for (size_t i = 0; i < inputs.size(); ++i) {
      const uint32_t got = s.encode(inputs[i], sat);
      if (got != want[i]) {
        mismatches.add(describe(inputs[i]) + " -> " + hex(got) + ", reference " + hex(want[i]));
      }
    }
    mismatches.expect_none(std::string(s.f.name) + " " + what +
                           (sat == Saturation::kSatFinite ? " satfinite" : " nosat"));
  }
  return want;
}

// FP8: a true linear search (all 128 codes of the input's sign) for every value and midpoint
// (and the FP32 values beside them) and for each of millions of random values.
TEST(Dtype, EncodingFP8MatchesLinearSearch) {
  for (const RefFormat& f : {kE4M3, kE5M2}) {
    const Reference& r = reference(f);
    const auto linear = [&](float x, Saturation sat) { return encode_by_linear_search(x, r, sat); };
    check_encoding(subject(f), every_value_and_midpoint(r), linear, "every value and midpoint");
    check_encoding(subject(f), random_inputs(r, 2'000'000, f.bias), linear, "linear search");
  }
}

// BF16/FP16: a linear search (all 32768 codes of the input's sign) on a sample; then the
// sorted-table search, first shown to agree with the linear search, on every value and
// midpoint and on millions of random values.
TEST(Dtype, EncodingBF16FP16MatchesSearch) {
  for (const RefFormat& f : {kBF16, kFP16}) {
    const Reference& r = reference(f);
    const auto linear = [&](float x, Saturation sat) { return encode_by_linear_search(x, r, sat); };
    const auto binary = [&](float x, Saturation sat) { return encode_by_binary_search(x, r, sat); };
    const std::vector<float> sample = random_inputs(r, 20'000, f.bias + 1);
    const std::vector<uint32_t> by_linear = check_encoding(subject(f), sample, linear, "linear");
    const std::vector<uint32_t> by_binary = expected_codes(sample, Saturation::kNoSat, binary);
    Mismatches disagreements;
    for (size_t i = 0; i < sample.size(); ++i) {
      if (by_binary[i] != by_linear[i]) {
        disagreements.add(describe(sample[i]) + ": binary " + hex(by_binary[i]) + ", linear " +
                          hex(by_linear[i]));
      }
    }
    disagreements.expect_none(std::string(f.name) + " binary vs linear search");

    check_encoding(subject(f), every_value_and_midpoint(r), binary, "every value and midpoint");
    const std::vector<float> inputs = random_inputs(r, 4'000'000, f.bias + 2);
    check_encoding(subject(f), inputs, binary, "sorted table");
  }
}

// --- stochastic rounding -------------------------------------------------------------------

// The neighbours of |x| (|x| <= max finite): the largest value <= |x| and the smallest
// >= |x|, as indices into the sorted table.
std::pair<size_t, size_t> neighbours(const Reference& r, double a) {
  const size_t hi =
      static_cast<size_t>(std::lower_bound(r.sorted_values.begin(), r.sorted_values.end(), a) -
                          r.sorted_values.begin());
  return {r.sorted_values[hi] == a ? hi : hi - 1, hi};
}

TEST(Dtype, StochasticKeepsExactValues) {
  const uint32_t randoms[] = {0u, 1u, 0x7FFFFFFFu, 0x80000000u, 0xFFFFFF00u, 0xFFFFFFFFu};
  for (const Subject& s : kSubjects) {
    const Reference& r = reference(s.f);
    Mismatches mismatches;
    for (uint32_t code = 0; code < r.by_code.size(); ++code) {
      if (!std::isfinite(r.by_code[code])) continue;
      const float x = static_cast<float>(r.by_code[code]);
      for (Saturation sat : {Saturation::kSatFinite, Saturation::kNoSat}) {
        for (uint32_t random : randoms) {
          const uint32_t got = s.encode_stochastic(x, random, sat);
          if (got != code) mismatches.add(describe(x) + " -> " + hex(got) + " with " + hex(random));
        }
      }
    }
    mismatches.expect_none(std::string(s.f.name) + " stochastic on exact values");
  }
}

TEST(Dtype, StochasticGivesOnlyTheTwoNeighbours) {
  std::mt19937_64 rng(11);
  for (const Subject& s : kSubjects) {
    const Reference& r = reference(s.f);
    Mismatches mismatches;
    for (float x : random_inputs(r, 200'000, 12)) {
      const double a = std::fabs(static_cast<double>(x));
      if (std::isnan(x) || a > r.max_finite) continue;
      const auto [lo, hi] = neighbours(r, a);
      const uint32_t sign = std::signbit(x) ? s.f.sign_bit() : 0;
      for (int draw = 0; draw < 4; ++draw) {
        const uint32_t random = static_cast<uint32_t>(rng());
        const Saturation sat = draw % 2 ? Saturation::kNoSat : Saturation::kSatFinite;
        const uint32_t got = s.encode_stochastic(x, random, sat);
        if (got != (sign | r.sorted_codes[lo]) && got != (sign | r.sorted_codes[hi])) {
          mismatches.add(describe(x) + " -> " + hex(got) + ", neighbours " +
                         hex(sign | r.sorted_codes[lo]) + " and " + hex(sign | r.sorted_codes[hi]));
        }
      }
    }
    mismatches.expect_none(std::string(s.f.name) + " stochastic neighbours");
  }
}

// The random threshold has 16 (BF16) or 24 (others) bits, so the probability of rounding up
// is exact to within 2^-16: the mean may be off by that much of a gap besides noise.
constexpr double kProbabilityResolution = 0x1p-16;

// For fixed x, the mean of many draws approaches x: |mean - x| below 5 standard errors of the
// two-point distribution (gap^2 p (1 - p) / N), plus the resolution above.
TEST(Dtype, StochasticIsUnbiasedForFixedValues) {
  constexpr int kDraws = 40'000;
  for (const Subject& s : kSubjects) {
    const Reference& r = reference(s.f);
    const size_t last = r.sorted_values.size() - 2;  // the largest finite value
    // Pairs of neighbours: zero and the smallest subnormal, subnormals, the smallest normals,
    // around 1 (or the middle of the range) and the top of the range.
    const size_t one =
        static_cast<size_t>(std::lower_bound(r.sorted_values.begin(), r.sorted_values.end(), 1.0) -
                            r.sorted_values.begin());
    for (size_t lo : {size_t{0}, size_t{1}, size_t{1} << s.f.man_bits, one, one + 1, last - 1}) {
      for (double p : {0.5, 0.25, 0.9, 0.1, 1e-3}) {
        const double gap = r.sorted_values[lo + 1] - r.sorted_values[lo];
        for (double sign : {1.0, -1.0}) {
          const float x = static_cast<float>(sign * (r.sorted_values[lo] + p * gap));
          const double actual_p = (std::fabs(static_cast<double>(x)) - r.sorted_values[lo]) / gap;
          double sum = 0.0;
          for (int i = 0; i < kDraws; ++i) {
            const uint32_t code = s.encode_stochastic(x, random_u32(7, i), Saturation::kSatFinite);
            sum += r.by_code[code];
          }
          const double mean_error = sum / kDraws - static_cast<double>(x);
          const double standard_error = gap * std::sqrt(actual_p * (1 - actual_p) / kDraws);
          EXPECT_LE(std::fabs(mean_error), 5 * standard_error + kProbabilityResolution * gap)
              << s.f.name << " x = " << describe(x) << " (p = " << actual_p << ")";
        }
      }
    }
  }
}

// Over many different values, one draw each, the rounding errors (in units of the local gap)
// average to zero: |sum| below 5 standard deviations of the sum of independent two-point
// errors, sqrt(sum p (1 - p)).
TEST(Dtype, StochasticIsUnbiasedAcrossTheRange) {
  for (const Subject& s : kSubjects) {
    const Reference& r = reference(s.f);
    double error_sum = 0.0;
    double variance = 0.0;
    size_t count = 0;
    const std::vector<float> inputs = random_inputs(r, 500'000, 21);
    for (size_t i = 0; i < inputs.size(); ++i) {
      const float x = inputs[i];
      const double a = std::fabs(static_cast<double>(x));
      if (std::isnan(x) || a > r.max_finite) continue;
      const auto [lo, hi] = neighbours(r, a);
      if (lo == hi) continue;
      const double gap = r.sorted_values[hi] - r.sorted_values[lo];
      const double p = (a - r.sorted_values[lo]) / gap;
      const uint32_t code = s.encode_stochastic(x, random_u32(99, i), Saturation::kSatFinite);
      error_sum += (std::fabs(r.by_code[code]) - a) / gap;
      variance += p * (1 - p);
      ++count;
    }
    EXPECT_GT(count, 100'000u);
    EXPECT_LE(std::fabs(error_sum), 5 * std::sqrt(variance) + kProbabilityResolution * count)
        << s.f.name << " over " << count << " values";
  }
}

// The result for element i depends on (seed, i) only: computing a stream in any order gives
// the same codes, and another seed gives another stream.
TEST(Dtype, StochasticIsReproducibleFromSeedAndIndex) {
  constexpr int kN = 4096;
  for (const Subject& s : kSubjects) {
    const Reference& r = reference(s.f);
    const float x = static_cast<float>((r.sorted_values[40] + r.sorted_values[41]) / 2);
    std::vector<uint32_t> forward(kN), backward(kN), other_seed(kN);
    for (int i = 0; i < kN; ++i) {
      forward[i] = s.encode_stochastic(x, random_u32(1234, i), Saturation::kSatFinite);
    }
    for (int i = kN - 1; i >= 0; --i) {
      backward[i] = s.encode_stochastic(x, random_u32(1234, i), Saturation::kSatFinite);
    }
    for (int i = 0; i < kN; ++i) {
      other_seed[i] = s.encode_stochastic(x, random_u32(1235, i), Saturation::kSatFinite);
    }
    EXPECT_EQ(forward, backward) << s.f.name;
    EXPECT_NE(forward, other_seed) << s.f.name;
    // Both neighbours occur (x is a midpoint).
    EXPECT_NE(std::count(forward.begin(), forward.end(), forward[0]), kN) << s.f.name;
  }
}

// --- the random numbers --------------------------------------------------------------------

constexpr uint64_t kRun = uint64_t{1} << 32;  // indices sharing one key of random_u32

// random_u32 written out from its definition in dtype.h's comment, in 64-bit arithmetic.
uint32_t reference_random(uint64_t seed, uint64_t index) {
  const auto murmur_finaliser = [](uint64_t x) {
    x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdULL;
    x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
  };
  const auto h = [](uint64_t x) {
    x = ((x ^ (x >> 16)) * 0x21f0aaadu) & 0xFFFFFFFFu;
    x = ((x ^ (x >> 15)) * 0x735a2d97u) & 0xFFFFFFFFu;
    return x ^ (x >> 15);
  };
  const uint64_t key =
      murmur_finaliser(seed ^ murmur_finaliser((index >> 32) + 0x9e3779b97f4a7c15ULL));
  const uint64_t lo = index & 0xFFFFFFFFu;
  return static_cast<uint32_t>(h(h(lo ^ (key & 0xFFFFFFFFu)) ^ (key >> 32)));
}

TEST(Dtype, RandomU32FollowsItsDefinition) {
  std::mt19937_64 rng(3);
  for (int i = 0; i < 100'000; ++i) {
    const uint64_t seed = rng();
    const uint64_t index = i % 2 ? rng() : rng() >> 40;
    ASSERT_EQ(random_u32(seed, index), reference_random(seed, index))
        << "seed " << seed << " index " << index;
  }
}

// RandomStream, the per-thread form the GPU kernels use, gives random_u32(seed, index) in any
// order of indices, within a run of 2^32 and across runs.
TEST(Dtype, RandomStreamEqualsRandomU32) {
  const uint64_t indices[] = {0,    1,        kRun - 1, kRun, kRun + 1,    5, 3 * kRun + 7,
                              kRun, kRun - 2, ~0ull,    0,    ~0ull - kRun};
  for (uint64_t seed : {0ull, 42ull, ~0ull}) {
    RandomStream stream(seed);
    for (uint64_t index : indices) {
      EXPECT_EQ(stream(index), random_u32(seed, index)) << "seed " << seed << " index " << index;
    }
  }
}

// The statistical tests read random_u32 as sequences over indices (one seed: from 0, across
// the run boundary at 2^32, far out) and over seeds (one index). Every bound is 6 standard
// deviations of its statistic under independent uniform draws, and the seeds are fixed, so
// each outcome is deterministic and a pass is no luck of the seeds chosen.
constexpr int kRandomDraws = 1 << 20;
constexpr uint64_t kRandomSeed = 0x5EED5EEDull;
// A chi-square with 255 degrees of freedom has mean 255 and standard deviation sqrt(510).
const double kChiSquareBound = 255 + 6 * std::sqrt(510.0);

struct RandomSequence {
  std::string name;
  std::function<uint32_t(uint64_t)> draw;  // the k-th number
};

std::vector<RandomSequence> random_sequences() {
  return {
      {"indices from 0", [](uint64_t k) { return random_u32(kRandomSeed, k); }},
      {"indices across 2^32",
       [](uint64_t k) { return random_u32(kRandomSeed, kRun - kRandomDraws / 2 + k); }},
      {"indices from 2^40 + 12345",
       [](uint64_t k) { return random_u32(kRandomSeed, (uint64_t{1} << 40) + 12345 + k); }},
      {"seeds from 0 at index 77", [](uint64_t k) { return random_u32(k, 77); }},
      {"seeds from 2^63 at index 2^32 + 3",
       [](uint64_t k) { return random_u32((uint64_t{1} << 63) + k, kRun + 3); }},
  };
}

double chi_square(const std::vector<int>& counts, double expected) {
  double sum = 0.0;
  for (int count : counts) sum += (count - expected) * (count - expected) / expected;
  return sum;
}

// Each of the 32 bits is set in half the draws, within 6 sd = 6 / (2 sqrt(N)).
TEST(Dtype, RandomBitsAreBalanced) {
  for (const RandomSequence& s : random_sequences()) {
    std::vector<int> set(32, 0);
    for (uint64_t k = 0; k < kRandomDraws; ++k) {
      const uint32_t x = s.draw(k);
      for (int bit = 0; bit < 32; ++bit) set[bit] += (x >> bit) & 1u;
    }
    for (int bit = 0; bit < 32; ++bit) {
      EXPECT_LE(std::fabs(static_cast<double>(set[bit]) / kRandomDraws - 0.5),
                3 / std::sqrt(kRandomDraws))
          << s.name << ": bit " << bit << " set " << set[bit] << " times";
    }
  }
}

// The thresholds of stochastic rounding are the top bits: the top byte is uniform over 256
// buckets (chi-square).
TEST(Dtype, RandomTopByteIsUniform) {
  for (const RandomSequence& s : random_sequences()) {
    std::vector<int> buckets(256, 0);
    for (uint64_t k = 0; k < kRandomDraws; ++k) ++buckets[s.draw(k) >> 24];
    EXPECT_LT(chi_square(buckets, kRandomDraws / 256.0), kChiSquareBound) << s.name;
  }
}

// Pairs that must look independent: neighbouring indices, indices a power of two apart (the
// same column of a matrix's rows; a single round of hash32 fails at some of these strides,
// which ones depending on the key), the same index in neighbouring runs of 2^32 and under
// neighbouring seeds. Two statistics per pair: the joint distribution of the
// top 4 bits of both numbers (16 x 16 cells, a chi-square with 255 degrees of freedom) and
// their correlation as uniform numbers (standard deviation 1 / sqrt(N)).
TEST(Dtype, RandomPairsAreIndependent) {
  struct Pair {
    std::string name;
    std::function<std::pair<uint32_t, uint32_t>(uint64_t)> draw;
  };
  std::vector<uint64_t> lags = {3, 7, kRun};
  for (int k = 0; k <= 20; ++k) lags.push_back(uint64_t{1} << k);
  std::vector<Pair> pairs;
  for (uint64_t lag : lags) {
    pairs.push_back(
        {"indices k and k + " + std::to_string(lag), [lag](uint64_t k) {
           return std::pair{random_u32(kRandomSeed, k), random_u32(kRandomSeed, k + lag)};
         }});
  }
  pairs.push_back({"index k under seeds s and s + 1", [](uint64_t k) {
                     return std::pair{random_u32(kRandomSeed, k), random_u32(kRandomSeed + 1, k)};
                   }});
  pairs.push_back({"index 77 under seeds k and k + 1", [](uint64_t k) {
                     return std::pair{random_u32(k, 77), random_u32(k + 1, 77)};
                   }});
  for (const Pair& p : pairs) {
    std::vector<int> cells(256, 0);
    double products = 0.0;
    for (uint64_t k = 0; k < kRandomDraws; ++k) {
      const auto [a, b] = p.draw(k);
      ++cells[(a >> 28) << 4 | (b >> 28)];
      products += (a / 4294967296.0 - 0.5) * (b / 4294967296.0 - 0.5);
    }
    EXPECT_LT(chi_square(cells, kRandomDraws / 256.0), kChiSquareBound) << p.name;
    // A uniform number on [0, 1) has variance 1/12.
    EXPECT_LE(std::fabs(12 * products / kRandomDraws), 6 / std::sqrt(kRandomDraws)) << p.name;
  }
}

// Outside the finite range stochastic rounding follows the deterministic rules: NaN becomes
// the canonical code; at or past the step beyond max (for FP8 and FP16 anywhere past max) it
// rounds to nearest, so overflow follows the saturation mode. (BF16 between max and 2^128
// rounds stochastically between max and inf, its two neighbours.)
TEST(Dtype, StochasticOutsideTheRange) {
  for (const Subject& s : kSubjects) {
    SCOPED_TRACE(s.f.name);
    const Reference& r = reference(s.f);
    std::vector<float> beyond = {INFINITY, -INFINITY};
    if (s.f.name != std::string("bf16")) {
      const float past_max = static_cast<float>(r.past_max);
      const float midpoint = static_cast<float>((r.max_finite + r.past_max) / 2);
      beyond.insert(beyond.end(), {up(static_cast<float>(r.max_finite)), down(midpoint), midpoint,
                                   up(midpoint), past_max, -past_max, -kFltMax, kFltMax});
    }
    for (uint32_t random : {0u, 0x80000000u, 0xFFFFFFFFu}) {
      for (Saturation sat : {Saturation::kSatFinite, Saturation::kNoSat}) {
        for (float nan : kNaNs) {
          EXPECT_EQ(hex(s.encode_stochastic(nan, random, sat)), hex(s.f.canonical_nan));
        }
        for (float x : beyond) {
          EXPECT_EQ(hex(s.encode_stochastic(x, random, sat)),
                    hex(encode_by_linear_search(x, r, sat)))
              << describe(x);
        }
      }
    }
  }
}

}  // namespace
}  // namespace mantissa::core
