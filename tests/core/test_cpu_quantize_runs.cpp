// The fused kernels of CPU block quantisation (core/ops/cpu/cpu_quantize_runs.h) and
// CpuBackend::quantize_blocks built on them, against block_scaling.h's scalar definitions
// applied here element by element:
//  - the kernels' quotients avoid a division for most scales (a reciprocal, exact for powers
//    of two, or refined by an FMA for the others), so every code is compared with
//    quantize_with_scale over all 65536 BF16 and all 65536 F16 inputs for a few hundred
//    scales (the row kernel
//    with one block and with blocks of 32, and the column kernel), and over all 2^32 FP32
//    inputs for two;
//  - the vectorised scale rule (block_scales) against block_scale and mx_scale_e8m0;
//  - quantize_blocks is compared block by block for every scale mode, both storage
//    transposes, F32/BF16/F16 sources and both FP8 formats, on shapes with partial blocks and
//    partial vector groups, with zero, infinite, NaN, subnormal and extreme blocks.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "core/ops/cpu/cpu_quantize_runs.h"
#include "core/precision/block_scaling.h"
#include "tests/common/block_sources.h"
#include "tests/common/test_util.h"

namespace mantissa::core {
namespace {

namespace qr = quantize_runs;

uint8_t want_code(DType code, float x, float s) {
  return code == DType::kE4M3 ? quantize_with_scale<fp8_e4m3>(x, s).bits
                              : quantize_with_scale<fp8_e5m2>(x, s).bits;
}

float from_bits(uint32_t bits) {
  return bits_to_float(bits);
}

// Scales that take each of the kernels' division methods and their edges: powers of two from
// 2^-149 to 2^127, all-ones and one-ulp mantissas, the bounds 2^-60 and 2^125 of the FMA
// method, subnormal scales, small odd multiples (whose quotients hit FP8 ties exactly), the
// scales block_scale gives, and random patterns.
std::vector<float> test_scales() {
  std::vector<float> s;
  for (int e = -149; e <= 127; e += (e < -120 || e > 110 || (e > -70 && e < -50)) ? 1 : 9) {
    s.push_back(std::ldexp(1.0f, e));
  }
  for (uint32_t exponent :
       {1u, 2u, 66u, 67u, 68u, 100u, 126u, 127u, 128u, 200u, 250u, 251u, 252u, 253u, 254u}) {
    for (uint32_t mantissa : {0x7FFFFFu, 1u, 0x400000u, 0x7FFFFEu, 0x2AAAABu, 0x555555u}) {
      s.push_back(from_bits(exponent << 23 | mantissa));
    }
  }
  for (uint32_t bits : {1u, 3u, 0x3FFFFFu, 0x400001u, 0x7FFFFFu}) s.push_back(from_bits(bits));
  for (float odd : {3.0f, 5.0f, 7.0f, 9.0f, 11.0f, 13.0f, 15.0f, 17.0f, 0.75f, 1.25f, 1.75f, 0.1f,
                    1.0f / 3.0f, 448.0f / 3.0f}) {
    for (int e : {-70, -60, -59, -20, 0, 20, 100}) s.push_back(std::ldexp(odd, e));
  }
  std::mt19937 rng(21);
  for (int i = 0; i < 40; ++i) {
    const float amax = from_bits(rng() & 0x7FFFFFFFu);
    if (!std::isfinite(amax)) continue;
    s.push_back(block_scale(amax, 448.0f, false));
    s.push_back(block_scale(amax, 57344.0f, false));
    s.push_back(block_scale(amax, 448.0f, true));
  }
  for (int i = 0; i < 60; ++i) {
    const uint32_t exponent = 1 + rng() % 253;
    s.push_back(from_bits(exponent << 23 | (rng() & 0x7FFFFFu)));
  }
  return s;
}

// The kernels' domain: the reciprocal-and-FMA quotient needs a finite x with x / s well
// inside FP32's range (quantize_blocks only divides |x| <= amax <= s fmt_max (1 + 2^-23), and
// makes a group of columns holding inf divide); the other methods take every input.
// Divisors with `finite` set (a block without inf or NaN) also skip the NaN test, so their
// runs and rows take finite x only.
bool in_domain(float x, float s, bool fma) {
  return !fma || (std::isfinite(x) && std::fabs(static_cast<double>(x)) <= std::ldexp(s, 64));
}

// Every input of the 16-bit source type T (bf16 or fp16), through each kernel, for every test
// scale and both FP8 formats; the row kernel also from the same values widened to FP32.
template <class T>
void check_every_16bit_input() {
  std::vector<T> x(65536);
  std::vector<float> xf(65536);
  for (uint32_t i = 0; i < 65536; ++i) {
    x[i] = T{static_cast<uint16_t>(i)};
    xf[i] = to_float(x[i]);
  }
  std::vector<uint8_t> run16(65536), run_f32(65536), columns(65536), divided(65536), row(65536),
      non_finite(65536);
  std::vector<qr::Divisor> d(qr::kColumns), blocks(65536 / 32);
  const int64_t rows = 65536 / qr::kColumns;
  int64_t compared = 0;
  for (float s : test_scales()) {
    // The column kernel gets a different scale in each lane: s times small odd numbers.
    bool lanes_fma = true;
    for (int64_t c = 0; c < qr::kColumns; ++c) {
      d[c] = qr::make_divisor(c == 0 ? s : s * static_cast<float>(2 * c + 1));
      lanes_fma = lanes_fma && d[c].how != qr::Division::kDivide;
    }
    const qr::Divisor ds = qr::make_divisor(s);
    const bool run_fma = ds.how == qr::Division::kReciprocalFma;
    qr::Divisor ds_non_finite = ds;  // as for a block holding inf or NaN
    ds_non_finite.finite = false;
    // The row kernel: blocks of 32 taking the lane scales in turn.
    for (size_t b = 0; b < blocks.size(); ++b) blocks[b] = d[b % qr::kColumns];
    for (DType code : {DType::kE4M3, DType::kE5M2}) {
      qr::quantize_row(x.data(), 65536, 65536, &ds, code, run16.data(), nullptr);
      qr::quantize_row(xf.data(), 65536, 65536, &ds, code, run_f32.data(), nullptr);
      qr::quantize_columns(x.data(), qr::kColumns, rows, d.data(), false, code, columns.data(),
                           nullptr);
      qr::quantize_columns(x.data(), qr::kColumns, rows, d.data(), true, code, divided.data(),
                           nullptr);
      qr::quantize_row(x.data(), 65536, 32, blocks.data(), code, row.data(), x.data());
      qr::quantize_row(x.data(), 65536, 65536, &ds_non_finite, code, non_finite.data(), nullptr);
      int mismatches = 0;
      for (uint32_t i = 0; i < 65536; ++i) {
        const float lane_s = d[i % qr::kColumns].s;
        const uint8_t want = want_code(code, xf[i], s), want_lane = want_code(code, xf[i], lane_s);
        const bool run_ok = !in_domain(xf[i], s, true) || (run16[i] == want && run_f32[i] == want);
        const bool non_finite_ok = !in_domain(xf[i], s, run_fma) || non_finite[i] == want;
        const bool columns_ok = divided[i] == want_lane &&
                                (!in_domain(xf[i], lane_s, lanes_fma) || columns[i] == want_lane);
        const float block_s = blocks[i / 32].s;
        const bool row_ok =
            !in_domain(xf[i], block_s, true) || row[i] == want_code(code, xf[i], block_s);
        compared += in_domain(xf[i], s, run_fma);
        if ((!run_ok || !non_finite_ok || !columns_ok || !row_ok) && ++mismatches <= 3) {
          ADD_FAILURE() << dtype_name(code) << " s = " << s << " (bits " << std::hex
                        << float_to_bits(s) << ") x bits " << i << ": run " << int(run16[i])
                        << " / " << int(run_f32[i]) << " columns " << int(columns[i]) << " / "
                        << int(divided[i]) << " row " << int(row[i]) << " non-finite run "
                        << int(non_finite[i]) << ", want " << int(want) << " / " << int(want_lane)
                        << std::dec;
        }
      }
      EXPECT_EQ(mismatches, 0) << dtype_name(code) << " s = " << s;
    }
  }
  // Most of the pairs lie in the domain (a guard against a test that compares nothing).
  EXPECT_GT(compared, static_cast<int64_t>(test_scales().size()) * 2 * 65536 * 3 / 4);
}

TEST(CpuQuantizeRuns, EveryBf16InputForManyScales) {
  check_every_16bit_input<bf16>();
}

TEST(CpuQuantizeRuns, EveryF16InputForManyScales) {
  check_every_16bit_input<fp16>();
}

// Every FP32 input in the domain for two scales of the FMA method: an all-ones mantissa and
// the scale of a block with amax 1000.
TEST(CpuQuantizeRuns, EveryF32InputForSomeScales) {
  const float scales[] = {from_bits(0x3FFFFFFFu), block_scale(1000.0f, 448.0f, false)};
  constexpr int64_t kChunk = 1 << 16;
  for (float s : scales) {
    const qr::Divisor d = qr::make_divisor(s);
    ASSERT_EQ(d.how, qr::Division::kReciprocalFma) << s;
    const float limit = s * 0x1p64f;  // in_domain's bound (inf where s * 2^64 overflows)
    int64_t mismatches = 0;
#pragma omp parallel reduction(+ : mismatches)
    {
      std::vector<float> x(kChunk);
      std::vector<uint8_t> got(kChunk);
#pragma omp for schedule(static)
      for (int64_t chunk = 0; chunk < (int64_t{1} << 32) / kChunk; ++chunk) {
        for (int64_t i = 0; i < kChunk; ++i) {
          x[i] = from_bits(static_cast<uint32_t>(chunk * kChunk + i));
        }
        qr::quantize_row(x.data(), kChunk, kChunk, &d, DType::kE4M3, got.data(), nullptr);
        for (int64_t i = 0; i < kChunk; ++i) {
          mismatches +=
              std::fabs(x[i]) <= limit && got[i] != quantize_with_scale<fp8_e4m3>(x[i], s).bits;
        }
      }
    }
    EXPECT_EQ(mismatches, 0) << "s = " << s;
  }
}

// block_scales' vector rule against block_scale and mx_scale_e8m0 on every BF16 magnitude,
// on FP32 amaxes within 40 ulps of each fmt_max * 2^e (where the quotient and the power-of-two
// test change), the subnormal quotients, zero, inf, NaN, and random patterns.
TEST(CpuQuantizeRuns, BlockScalesEqualTheScalarRules) {
  std::vector<uint32_t> amax;
  for (uint32_t b = 0; b < 0x8000u; ++b) amax.push_back(b << 16 | (b * 2654435761u >> 16));
  for (float fmt_max : {448.0f, 57344.0f}) {
    for (int e = -160; e <= 128; ++e) {
      const float center = std::ldexp(fmt_max, e);
      if (!std::isfinite(center) || center == 0.0f) continue;
      for (int delta = -40; delta <= 40; ++delta) {
        amax.push_back(float_to_bits(center) + static_cast<uint32_t>(delta));
      }
    }
  }
  for (uint32_t bits : {0u, 1u, 2u, 0x7F800000u, 0x7F800001u, 0x7FC00000u, 0x7FFFFFFFu, 0x7F7FFFFFu,
                        0x00400000u, 0x00800000u}) {
    amax.push_back(bits);
  }
  std::mt19937 rng(22);
  for (int i = 0; i < 200000; ++i) amax.push_back(rng() & 0x7FFFFFFFu);
  const int64_t n = static_cast<int64_t>(amax.size());
  std::vector<float> s(n);
  std::vector<uint8_t> e8m0(n);
  std::vector<qr::Divisor> d(n);
  for (float fmt_max : {448.0f, 57344.0f}) {
    for (int rule = 0; rule < 3; ++rule) {  // plain, power of two, MXFP8
      const bool pow2 = rule >= 1, mx = rule == 2;
      qr::block_scales(amax.data(), n, fmt_max, pow2, mx, s.data(), e8m0.data(), d.data());
      int mismatches = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float a = bits_to_float(amax[i]);
        const uint8_t want_e = mx_scale_e8m0(a, fmt_max);
        const float want = mx ? e8m0_to_float(want_e) : block_scale(a, fmt_max, pow2);
        const bool ok =
            float_to_bits(s[i]) == float_to_bits(want) &&
            float_to_bits(d[i].s) == float_to_bits(want) && (!mx || e8m0[i] == want_e) &&
            (d[i].how == qr::Division::kDivide || d[i].r == 1.0f / want) &&
            d[i].how == qr::make_divisor(want).how && d[i].finite == (amax[i] < 0x7F800000u);
        if (!ok && ++mismatches <= 3) {
          ADD_FAILURE() << "amax bits " << std::hex << amax[i] << " fmt_max " << fmt_max << " rule "
                        << rule << ": " << float_to_bits(s[i]) << ", want " << float_to_bits(want)
                        << std::dec;
        }
      }
      EXPECT_EQ(mismatches, 0) << fmt_max << " rule " << rule;
    }
  }
}

TEST(CpuQuantizeRuns, TransposesSixteenBySixteenBytes) {
  std::vector<uint8_t> src(40 * 20), dst(30 * 25, 0);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  qr::transpose16x16(src.data() + 20 + 2, 20, dst.data() + 25 + 3, 25);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      ASSERT_EQ(dst[(1 + c) * 25 + 3 + r], src[(1 + r) * 20 + 2 + c]) << r << ", " << c;
    }
  }
}

// ---------------------------------------------------------------------------------------
// quantize_blocks against the scalar definitions.

float element(const Tensor& src, bool transpose, int64_t outer, int64_t k, int64_t i, int64_t kk) {
  return static_cast<float>(value_at(src, transpose ? kk * outer + i : i * k + kk));
}

void expect_definition(const Tensor& src, DType code, const BlockQuantizeParams& p0,
                       const std::string& what) {
  const bool tr = p0.transpose;
  const int64_t outer = src.dim(tr ? 1 : 0), k = src.dim(tr ? 0 : 1);
  Tensor codes = Tensor::empty(Shape{outer, k}, code);
  Tensor scales = Tensor::empty(Shape{scale_count(p0.mode, outer, k)}, scale_dtype(p0.mode));
  std::memset(codes.data(), 0x55, static_cast<size_t>(codes.nbytes()));
  Tensor amax_out = f32_scalar(-1.0f);
  BlockQuantizeParams p = p0;
  p.amax = &amax_out;
  make_cpu_backend()->quantize_blocks(src, codes, scales, p);

  const bool mx = p.mode == ScaleMode::kVec32Ue8m0;
  const float fmt_max = code == DType::kE4M3 ? 448.0f : 57344.0f;
  const int64_t block_rows = scale_block_rows(p.mode, outer), block_k = scale_block_k(p.mode, k);
  int mismatches = 0;
  bool any_nan = false;
  float total = 0.0f;
  for (int64_t i0 = 0; i0 < outer; i0 += block_rows) {
    const int64_t i1 = std::min(outer, i0 + block_rows);
    for (int64_t b = 0; b < scale_k_blocks(p.mode, k); ++b) {
      const int64_t k0 = b * block_k, k1 = std::min(k, k0 + block_k);
      float amax = 0.0f;
      bool nan = false;
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t kk = k0; kk < k1; ++kk) {
          const float x = element(src, tr, outer, k, i, kk);
          nan = nan || std::isnan(x);
          amax = std::max(amax, std::fabs(x));
        }
      }
      any_nan = any_nan || nan;
      total = std::max(total, amax);
      if (nan) amax = NAN;
      const int64_t index = scale_index(p.mode, outer, k, i0, b);
      float s;
      if (mx) {
        const uint8_t e = mx_scale_e8m0(amax, fmt_max);
        EXPECT_EQ(code_at(scales, index), e) << what << " block " << i0 << ", " << b;
        s = e8m0_to_float(e);
      } else {
        s = block_scale(amax, fmt_max, p.power_of_two);
        EXPECT_EQ(code_at(scales, index), float_to_bits(s)) << what << " block " << i0 << ", " << b;
      }
      for (int64_t i = i0; i < i1; ++i) {
        for (int64_t kk = k0; kk < k1; ++kk) {
          const uint8_t want = want_code(code, element(src, tr, outer, k, i, kk), s);
          const uint64_t got = code_at(codes, i * k + kk);
          if (got != want && ++mismatches <= 3) {
            ADD_FAILURE() << what << ": code (" << i << ", " << kk << ") is " << got << ", want "
                          << int(want) << " (s = " << s << ")";
          }
        }
      }
    }
  }
  EXPECT_EQ(mismatches, 0) << what;
  const float got_amax = amax_out.data_as<float>()[0];
  if (any_nan) {
    EXPECT_EQ(float_to_bits(got_amax), 0x7FC00000u) << what;
  } else {
    EXPECT_EQ(float_to_bits(got_amax), float_to_bits(total)) << what;
  }
}

TEST(CpuQuantizeBlocks, EqualsTheScalarDefinitionEverywhere) {
  const ScaleMode modes[] = {ScaleMode::kVec128, ScaleMode::kBlock128, ScaleMode::kOuterVec,
                             ScaleMode::kVec32Ue8m0};
  // Source shapes: partial 128-row and 128/32-element blocks, K and outer not multiples of the
  // vector width or of the 32 lanes of the transposed kernels, single rows and columns, and
  // rows of more than eight 128-blocks.
  const Shape shapes[] = {Shape{37, 97}, Shape{70, 161}, Shape{260, 400}, Shape{131, 259},
                          Shape{1, 45},  Shape{45, 1},   Shape{96, 64},   Shape{5, 1100}};
  uint32_t seed = 100;
  for (const Shape& shape : shapes) {
    for (DType src_dtype : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (bool non_finite : {false, true}) {
        const Tensor src = special_source(shape, src_dtype, ++seed, non_finite);
        for (ScaleMode mode : modes) {
          for (bool transpose : {false, true}) {
            for (bool pow2 : {false, true}) {
              if (pow2 && mode == ScaleMode::kVec32Ue8m0) continue;
              for (DType code : {DType::kE4M3, DType::kE5M2}) {
                BlockQuantizeParams p;
                p.mode = mode;
                p.transpose = transpose;
                p.power_of_two = pow2;
                expect_definition(src, code, p,
                                  std::string(scale_mode_name(mode)) + " " + dtype_name(src_dtype) +
                                      "->" + dtype_name(code) + (transpose ? " transposed" : "") +
                                      (pow2 ? " pow2" : "") + (non_finite ? " non-finite" : "") +
                                      " " + shape.str());
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace mantissa::core
