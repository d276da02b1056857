// The bulk conversions of cpu_convert.h against the scalar definitions of core/dtype/dtype.h:
// every result must be bit-identical (NaN patterns included), whatever the length, the
// alignment, the split into chunks or the number of threads. The scalar functions themselves
// are checked against independent references in test_dtype.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/ops/cpu/cpu_convert.h"
#include "core/ops/cpu/cpu_narrow_avx512.h"
#include "core/ops/cpu/cpu_switch.h"

namespace mantissa::core {
namespace {

// Large enough that the conversions split the work across threads and run full blocks.
constexpr int64_t kLarge = 100003;

template <class T>
DType dtype_of();
template <>
DType dtype_of<float>() {
  return DType::kF32;
}
template <>
DType dtype_of<bf16>() {
  return DType::kBF16;
}
template <>
DType dtype_of<fp16>() {
  return DType::kF16;
}
template <>
DType dtype_of<fp8_e4m3>() {
  return DType::kE4M3;
}
template <>
DType dtype_of<fp8_e5m2>() {
  return DType::kE5M2;
}

uint32_t bits_of(float x) {
  return std::bit_cast<uint32_t>(x);
}
uint32_t bits_of(bf16 x) {
  return x.bits;
}
uint32_t bits_of(fp16 x) {
  return x.bits;
}
uint32_t bits_of(fp8_e4m3 x) {
  return x.bits;
}
uint32_t bits_of(fp8_e5m2 x) {
  return x.bits;
}

std::string hex(uint32_t bits) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08X", bits);
  return text;
}

// Reports the first few elements whose bit patterns differ.
template <class T, class Input>
void expect_same_bits(const std::vector<T>& got, const std::vector<T>& want,
                      const std::vector<Input>& input, const std::string& context) {
  ASSERT_EQ(got.size(), want.size()) << context;
  int reported = 0;
  for (size_t i = 0; i < got.size() && reported < 5; ++i) {
    if (bits_of(got[i]) != bits_of(want[i])) {
      ADD_FAILURE() << context << ": element " << i << " (input " << hex(bits_of(input[i]))
                    << ") gave " << hex(bits_of(got[i])) << ", scalar gives "
                    << hex(bits_of(want[i]));
      ++reported;
    }
  }
}

const float kScales[] = {1.0f, 0.5f, 3.0f, 1.0f / 3.0f, -1.5f, 1e-20f, 1e20f};

// --- widening ------------------------------------------------------------------------------

template <class T>
void check_widen(const std::vector<T>& codes, const std::string& name) {
  for (float scale : kScales) {
    std::vector<float> want(codes.size());
    for (size_t i = 0; i < codes.size(); ++i) want[i] = to_float(codes[i]) * scale;
    std::vector<float> got(codes.size(), -1.0f);
    widen_to_f32(codes.data(), dtype_of<T>(), got.data(), static_cast<int64_t>(codes.size()),
                 scale);
    expect_same_bits(got, want, codes, name + " scale " + std::to_string(scale));
  }
}

// Every code of the format, once in order (single-threaded for 8-bit formats) and repeated in
// a shuffled order long enough to be split across threads.
template <class T>
std::vector<T> every_code_in_order(int bits) {
  std::vector<T> codes(size_t{1} << bits);
  for (size_t i = 0; i < codes.size(); ++i) codes[i].bits = static_cast<decltype(T::bits)>(i);
  return codes;
}

template <class T>
std::vector<T> every_code_shuffled(int bits, int64_t n) {
  const std::vector<T> all = every_code_in_order<T>(bits);
  std::vector<T> codes(static_cast<size_t>(n));
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = all[i % all.size()];
  std::mt19937_64 rng(bits);
  std::shuffle(codes.begin(), codes.end(), rng);
  return codes;
}

TEST(CpuConvert, WidenEveryCode) {
  check_widen(every_code_in_order<bf16>(16), "bf16");
  check_widen(every_code_in_order<fp16>(16), "f16");
  check_widen(every_code_in_order<fp8_e4m3>(8), "e4m3");
  check_widen(every_code_in_order<fp8_e5m2>(8), "e5m2");
  check_widen(every_code_shuffled<bf16>(16, kLarge), "bf16 shuffled");
  check_widen(every_code_shuffled<fp16>(16, kLarge), "f16 shuffled");
  check_widen(every_code_shuffled<fp8_e4m3>(8, kLarge), "e4m3 shuffled");
  check_widen(every_code_shuffled<fp8_e5m2>(8, kLarge), "e5m2 shuffled");
}

TEST(CpuConvert, WidenF32IsScaledCopy) {
  std::mt19937 rng(7);
  std::vector<float> src(kLarge);
  for (float& x : src) x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
  check_widen(src, "f32");
}

// Every length from 0 to 40 at every offset from 0 to 8 elements: vector bodies, scalar tails
// and unaligned addresses.
template <class T>
void check_widen_lengths(int bits) {
  const std::vector<T> all = every_code_shuffled<T>(bits, 64);
  for (int offset = 0; offset <= 8; ++offset) {
    for (int n = 0; n <= 40; ++n) {
      const std::vector<T> codes(all.begin() + offset, all.begin() + offset + n);
      std::vector<float> got(static_cast<size_t>(n) + 9, -7.0f);
      widen_to_f32(codes.data(), dtype_of<T>(), got.data() + offset, n, 2.0f);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(bits_of(got[offset + i]), bits_of(to_float(codes[i]) * 2.0f))
            << "offset " << offset << " length " << n << " element " << i;
      }
      // Nothing written outside [offset, offset + n).
      for (int i = 0; i < offset; ++i) EXPECT_EQ(got[i], -7.0f);
      for (size_t i = offset + n; i < got.size(); ++i) EXPECT_EQ(got[i], -7.0f);
    }
  }
}

TEST(CpuConvert, WidenOddLengthsAndOffsets) {
  check_widen_lengths<bf16>(16);
  check_widen_lengths<fp16>(16);
  check_widen_lengths<fp8_e4m3>(8);
  check_widen_lengths<fp8_e5m2>(8);
}

// --- narrowing -----------------------------------------------------------------------------

// Inputs that cover every rounding path of every format: arbitrary bit patterns (NaNs with
// all kinds of payloads, infinities, FP32 subnormals, huge values), magnitudes spread
// log-uniformly over all the formats' ranges, exact midpoints between neighbouring codes
// (ties) and their FP32 neighbours, and the boundary values of each format.
std::vector<float> narrow_inputs(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> log2_magnitude(-30.0, 20.0);
  const std::vector<float> boundaries = {0.0f,
                                         -0.0f,
                                         INFINITY,
                                         -INFINITY,
                                         NAN,
                                         -NAN,
                                         std::bit_cast<float>(0x7F800001u),
                                         std::bit_cast<float>(0xFFFFFFFFu),
                                         std::numeric_limits<float>::max(),
                                         std::numeric_limits<float>::denorm_min(),
                                         std::numeric_limits<float>::min(),
                                         448.0f,
                                         464.0f,
                                         std::nextafter(464.0f, 1e9f),
                                         480.0f,
                                         57344.0f,
                                         61440.0f,
                                         std::nextafter(61440.0f, 0.0f),
                                         65504.0f,
                                         65520.0f,
                                         std::nextafter(65520.0f, 0.0f),
                                         0x1p-6f,
                                         0x1p-9f,
                                         0x1p-10f,
                                         0x1p-14f,
                                         0x1p-16f,
                                         0x1p-17f,
                                         0x1p-24f,
                                         0x1p-25f,
                                         0x1.FEp127f,
                                         0x1.FFp127f,
                                         0x1p-133f,
                                         0x1p-134f};
  std::vector<float> out(static_cast<size_t>(n));
  for (float& x : out) {
    const double sign = (rng() & 1) ? -1.0 : 1.0;
    switch (rng() % 6) {
      case 0: x = std::bit_cast<float>(static_cast<uint32_t>(rng())); break;
      case 1:
      case 2: x = static_cast<float>(sign * std::exp2(log2_magnitude(rng))); break;
      case 3: {  // a midpoint of two neighbouring codes, or one FP32 ulp beside it
        // code c and c + 1 below each format's largest finite code
        const uint32_t c = static_cast<uint32_t>(rng());
        const auto e4m3 = [](uint32_t k) { return e4m3_to_float({static_cast<uint8_t>(k)}); };
        const auto e5m2 = [](uint32_t k) { return e5m2_to_float({static_cast<uint8_t>(k)}); };
        const auto f16 = [](uint32_t k) { return fp16_to_float({static_cast<uint16_t>(k)}); };
        const auto b16 = [](uint32_t k) { return bf16_to_float({static_cast<uint16_t>(k)}); };
        double sum = 0.0;
        switch (rng() % 4) {
          case 0: sum = double{e4m3(c % 0x7E)} + e4m3(c % 0x7E + 1); break;
          case 1: sum = double{e5m2(c % 0x7B)} + e5m2(c % 0x7B + 1); break;
          case 2: sum = double{f16(c % 0x7BFF)} + f16(c % 0x7BFF + 1); break;
          default: sum = double{b16(c % 0x7F7F)} + b16(c % 0x7F7F + 1); break;
        }
        x = static_cast<float>(sign * sum / 2);
        const int nudge = static_cast<int>(rng() % 3);
        if (nudge == 1) x = std::nextafter(x, INFINITY);
        if (nudge == 2) x = std::nextafter(x, -INFINITY);
        break;
      }
      case 4: x = boundaries[rng() % boundaries.size()]; break;
      default: x = static_cast<float>(sign * static_cast<double>(rng() % 512)); break;
    }
  }
  return out;
}

// What narrow_from_f32 must produce, element by element from dtype.h.
template <class T>
std::vector<T> scalar_narrow(const std::vector<float>& src, const NarrowOptions& o) {
  std::vector<T> out(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    const float scaled = src[i] * o.scale;
    out[i] = o.stochastic ? Rounder<T>::stochastic(scaled, random_u32(o.seed, o.index_base + i),
                                                   o.saturation)
                          : Rounder<T>::nearest(scaled, o.saturation);
  }
  return out;
}

template <class T>
std::vector<T> bulk_narrow(const std::vector<float>& src, const NarrowOptions& o) {
  std::vector<T> out(src.size());
  narrow_from_f32(src.data(), out.data(), dtype_of<T>(), static_cast<int64_t>(src.size()), o);
  return out;
}

std::string describe(const NarrowOptions& o) {
  return std::string("scale ") + std::to_string(o.scale) +
         (o.saturation == Saturation::kSatFinite ? " satfinite" : " nosat") +
         (o.stochastic ? " stochastic" : " nearest");
}

template <class T>
void check_narrow(const std::vector<float>& src, const std::string& name) {
  for (float scale : kScales) {
    for (Saturation sat : {Saturation::kSatFinite, Saturation::kNoSat}) {
      for (bool stochastic : {false, true}) {
        NarrowOptions o;
        o.scale = scale;
        o.saturation = sat;
        o.stochastic = stochastic;
        o.seed = 0x5EED0000u + static_cast<uint64_t>(scale * 1000);
        o.index_base = 12345;
        expect_same_bits(bulk_narrow<T>(src, o), scalar_narrow<T>(src, o), src,
                         name + " " + describe(o));
      }
    }
  }
}

TEST(CpuConvert, NarrowMatchesScalarOnRandomData) {
  const std::vector<float> src = narrow_inputs(kLarge, 1);
  check_narrow<float>(src, "f32");
  check_narrow<bf16>(src, "bf16");
  check_narrow<fp16>(src, "f16");
  check_narrow<fp8_e4m3>(src, "e4m3");
  check_narrow<fp8_e5m2>(src, "e5m2");
}

// Every FP32 value a 16-bit or 8-bit code decodes to, and the midpoints between neighbours:
// the exact values and ties of every format.
TEST(CpuConvert, NarrowMatchesScalarOnEveryCodeAndMidpoint) {
  std::vector<float> src;
  for (uint32_t c = 0; c < 65536; ++c) {
    const float a = bf16_to_float({static_cast<uint16_t>(c)});
    const float b = fp16_to_float({static_cast<uint16_t>(c)});
    src.push_back(a);
    src.push_back(b);
    if ((c & 0x7FFF) < 0x7F7F) {
      src.push_back(static_cast<float>(
          (static_cast<double>(a) + bf16_to_float({static_cast<uint16_t>(c + 1)})) / 2));
    }
    if ((c & 0x7FFF) < 0x7BFF) {
      src.push_back(static_cast<float>(
          (static_cast<double>(b) + fp16_to_float({static_cast<uint16_t>(c + 1)})) / 2));
    }
  }
  for (uint32_t c = 0; c < 256; ++c) {
    const uint8_t next = static_cast<uint8_t>(c + 1);
    src.push_back(e4m3_to_float({static_cast<uint8_t>(c)}));
    src.push_back(e5m2_to_float({static_cast<uint8_t>(c)}));
    src.push_back((e4m3_to_float({static_cast<uint8_t>(c)}) + e4m3_to_float({next})) / 2);
    src.push_back((e5m2_to_float({static_cast<uint8_t>(c)}) + e5m2_to_float({next})) / 2);
  }
  check_narrow<float>(src, "f32");
  check_narrow<bf16>(src, "bf16");
  check_narrow<fp16>(src, "f16");
  check_narrow<fp8_e4m3>(src, "e4m3");
  check_narrow<fp8_e5m2>(src, "e5m2");
}

// Lengths 0..70 at offsets 0..8 (vector bodies of 8 and 32 elements, scalar tails, unaligned
// addresses), without writing outside the destination range.
template <class T>
void check_narrow_lengths() {
  const std::vector<float> all = narrow_inputs(80, 3);
  for (bool stochastic : {false, true}) {
    for (int offset = 0; offset <= 8; ++offset) {
      for (int n = 0; n <= 70; ++n) {
        const std::vector<float> src(all.begin() + offset, all.begin() + offset + n);
        NarrowOptions o;
        o.scale = 0.75f;
        o.stochastic = stochastic;
        o.seed = 99;
        const std::vector<T> want = scalar_narrow<T>(src, o);
        T sentinel;
        std::memset(&sentinel, 0x5A, sizeof sentinel);
        std::vector<T> got(static_cast<size_t>(n) + 9, sentinel);
        narrow_from_f32(src.data(), got.data() + offset, dtype_of<T>(), n, o);
        for (int i = 0; i < n; ++i) {
          EXPECT_EQ(bits_of(got[offset + i]), bits_of(want[i]))
              << dtype_name(dtype_of<T>()) << " offset " << offset << " length " << n << " element "
              << i << (stochastic ? " stochastic" : " nearest");
        }
        for (int i = 0; i < offset; ++i) EXPECT_EQ(bits_of(got[i]), bits_of(sentinel));
        for (size_t i = offset + n; i < got.size(); ++i) {
          EXPECT_EQ(bits_of(got[i]), bits_of(sentinel));
        }
      }
    }
  }
}

TEST(CpuConvert, NarrowOddLengthsAndOffsets) {
  check_narrow_lengths<float>();
  check_narrow_lengths<bf16>();
  check_narrow_lengths<fp16>();
  check_narrow_lengths<fp8_e4m3>();
  check_narrow_lengths<fp8_e5m2>();
}

// A conversion done in arbitrary chunks, each told where it starts (index_base), equals the
// conversion done at once: stochastic rounding depends on (seed, global index) only.
template <class T>
void check_chunking() {
  const std::vector<float> src = narrow_inputs(kLarge, 4);
  for (bool stochastic : {false, true}) {
    NarrowOptions whole;
    whole.scale = 2.0f;
    whole.stochastic = stochastic;
    whole.seed = 2024;
    whole.index_base = 1000;
    const std::vector<T> want = bulk_narrow<T>(src, whole);

    std::vector<T> got(src.size());
    const int64_t chunks[] = {1, 7, 8, 33, 4096, 70001, 100000};
    int64_t begin = 0;
    for (int k = 0; begin < kLarge; ++k) {
      const int64_t n = std::min(chunks[k % 7], kLarge - begin);
      NarrowOptions part = whole;
      part.index_base = whole.index_base + static_cast<uint64_t>(begin);
      narrow_from_f32(src.data() + begin, got.data() + begin, dtype_of<T>(), n, part);
      begin += n;
    }
    expect_same_bits(got, want, src,
                     std::string(dtype_name(dtype_of<T>())) + " chunked " + describe(whole));
  }
}

TEST(CpuConvert, ChunkedEqualsWhole) {
  check_chunking<bf16>();
  check_chunking<fp16>();
  check_chunking<fp8_e4m3>();
  check_chunking<fp8_e5m2>();
}

// Stochastic rounding across a multiple of 2^32 in the global index, where random_u32 changes
// key: the bulk conversion equals the scalar one wherever the boundary falls in a vector, a
// 32-element step or a thread's block, including where the index wraps past 2^64.
template <class T>
void check_random_run_boundaries() {
  const std::vector<float> src = narrow_inputs(kLarge, 6);
  const int64_t positions[] = {0, 1, 7, 8, 13, 31, 32, 33, 16384, 50000, kLarge - 1, kLarge};
  for (uint64_t boundary : {uint64_t{1} << 32, uint64_t{5} << 32, uint64_t{0}}) {
    for (int64_t at : positions) {
      NarrowOptions o;
      o.stochastic = true;
      o.seed = 77;
      o.index_base = boundary - static_cast<uint64_t>(at);
      expect_same_bits(bulk_narrow<T>(src, o), scalar_narrow<T>(src, o), src,
                       std::string(dtype_name(dtype_of<T>())) + " boundary " +
                           std::to_string(boundary) + " at element " + std::to_string(at));
    }
  }
}

TEST(CpuConvert, StochasticAcrossRandomRunBoundaries) {
  check_random_run_boundaries<bf16>();
  check_random_run_boundaries<fp16>();
  check_random_run_boundaries<fp8_e4m3>();
  check_random_run_boundaries<fp8_e5m2>();
}

// --- amax ----------------------------------------------------------------------------------

// max |x| in double, NaN when any element is NaN: computed independently of the bit tricks.
double reference_amax(const std::vector<float>& x) {
  double m = 0.0;
  for (float v : x) {
    if (std::isnan(v)) return NAN;
    m = std::max(m, std::fabs(static_cast<double>(v)));
  }
  return m;
}

template <class T>
void check_amax(const std::vector<float>& src, const std::string& context) {
  for (bool stochastic : {false, true}) {
    NarrowOptions o;
    o.scale = 0.125f;  // amax is taken before scaling
    o.stochastic = stochastic;
    o.want_amax = true;
    std::vector<T> dst(src.size());
    const float got =
        narrow_from_f32(src.data(), dst.data(), dtype_of<T>(), static_cast<int64_t>(src.size()), o);
    const double want = reference_amax(src);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << context << ": amax " << got << ", want NaN";
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << context;
    }
    // The codes are unaffected by asking for the amax.
    expect_same_bits(dst, scalar_narrow<T>(src, o), src, context + " codes");
  }
}

template <class T>
void check_amax_cases() {
  const std::string name = dtype_name(dtype_of<T>());
  std::mt19937_64 rng(5);
  std::uniform_real_distribution<float> value(-1000.0f, 1000.0f);
  for (int64_t n :
       {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{13}, int64_t{100}, kLarge}) {
    std::vector<float> src(static_cast<size_t>(n));
    for (float& x : src) x = value(rng);
    check_amax<T>(src, name + " n=" + std::to_string(n));
    if (n == 0) continue;
    // The largest magnitude, negative, in every kind of position.
    for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
      std::vector<float> with_peak = src;
      with_peak[at] = -5000.0f;
      check_amax<T>(with_peak, name + " n=" + std::to_string(n) + " peak at " + std::to_string(at));
    }
    // One NaN (of either sign) anywhere wins, even next to an infinity.
    for (int64_t at : {int64_t{0}, n / 3, n - 1}) {
      for (uint32_t nan : {0x7FC00000u, 0xFFC00000u, 0x7F800001u}) {
        std::vector<float> with_nan = src;
        with_nan[n / 2] = -INFINITY;
        with_nan[at] = std::bit_cast<float>(nan);
        check_amax<T>(with_nan, name + " n=" + std::to_string(n) + " NaN " + hex(nan) + " at " +
                                    std::to_string(at));
      }
    }
    std::vector<float> with_inf = src;
    with_inf[n - 1] = -INFINITY;
    check_amax<T>(with_inf, name + " n=" + std::to_string(n) + " -inf");
  }
  check_amax<T>(std::vector<float>(1000, -0.0f), name + " all -0");
}

TEST(CpuConvert, FusedAmax) {
  check_amax_cases<float>();
  check_amax_cases<bf16>();
  check_amax_cases<fp16>();
  check_amax_cases<fp8_e4m3>();
  check_amax_cases<fp8_e5m2>();
}

TEST(CpuConvert, AmaxOnlyWhenAsked) {
  const std::vector<float> src = {1.0f, -300.0f, NAN};
  std::vector<fp8_e4m3> dst(src.size());
  EXPECT_EQ(narrow_from_f32(src.data(), dst.data(), DType::kE4M3, 3, NarrowOptions{}), 0.0f);
}

// --- narrowing from BF16 and F16 -----------------------------------------------------------

// narrow_from_16bit gives the codes of the scalar rounding of the widened source, and the
// widened source's amax, for every scale and saturation.
template <class Src, class T>
void check_narrow_from_16bit(const std::vector<Src>& src, const std::string& name) {
  std::vector<float> widened(src.size());
  for (size_t i = 0; i < src.size(); ++i) widened[i] = to_float(src[i]);
  const double want_amax = reference_amax(widened);
  for (float scale : kScales) {
    for (Saturation sat : {Saturation::kSatFinite, Saturation::kNoSat}) {
      NarrowOptions o;
      o.scale = scale;
      o.saturation = sat;
      o.want_amax = true;
      const std::string context = name + " -> " + dtype_name(dtype_of<T>()) + " " + describe(o);
      std::vector<T> got(src.size());
      const float amax = narrow_from_16bit(src.data(), dtype_of<Src>(), got.data(), dtype_of<T>(),
                                           static_cast<int64_t>(src.size()), o);
      expect_same_bits(got, scalar_narrow<T>(widened, o), src, context);
      if (std::isnan(want_amax)) {
        EXPECT_TRUE(std::isnan(amax)) << context << ": amax " << amax;
      } else {
        EXPECT_EQ(static_cast<double>(amax), want_amax) << context;
      }
    }
  }
}

// Lengths 0..70 at offsets 0..8, without writing outside the destination range.
template <class Src, class T>
void check_narrow_from_16bit_lengths(const std::vector<Src>& all) {
  for (int offset = 0; offset <= 8; ++offset) {
    for (int n = 0; n <= 70; ++n) {
      const std::vector<Src> src(all.begin() + offset, all.begin() + offset + n);
      std::vector<float> widened(src.size());
      for (size_t i = 0; i < src.size(); ++i) widened[i] = to_float(src[i]);
      NarrowOptions o;
      o.scale = 0.75f;
      const std::vector<T> want = scalar_narrow<T>(widened, o);
      T sentinel;
      std::memset(&sentinel, 0x5A, sizeof sentinel);
      std::vector<T> got(static_cast<size_t>(n) + 9, sentinel);
      narrow_from_16bit(src.data(), dtype_of<Src>(), got.data() + offset, dtype_of<T>(), n, o);
      for (int i = 0; i < n; ++i) {
        EXPECT_EQ(bits_of(got[offset + i]), bits_of(want[i]))
            << dtype_name(dtype_of<Src>()) << " -> " << dtype_name(dtype_of<T>()) << " offset "
            << offset << " length " << n << " element " << i;
      }
      for (int i = 0; i < offset; ++i) EXPECT_EQ(bits_of(got[i]), bits_of(sentinel));
      for (size_t i = offset + n; i < got.size(); ++i)
        EXPECT_EQ(bits_of(got[i]), bits_of(sentinel));
    }
  }
}

// Every code of the source format, in a shuffled array long enough to be split across
// threads, once with its NaNs (the amax is NaN) and once without them.
template <class Src>
void check_every_16bit_source(const std::string& name) {
  const std::vector<Src> every = every_code_shuffled<Src>(16, kLarge);
  std::vector<Src> finite;
  for (Src c : every) {
    if (!std::isnan(to_float(c))) finite.push_back(c);
  }
  for (const auto& [src, label] : {std::pair{every, name}, std::pair{finite, name + " finite"}}) {
    check_narrow_from_16bit<Src, float>(src, label);
    check_narrow_from_16bit<Src, bf16>(src, label);
    check_narrow_from_16bit<Src, fp16>(src, label);
    check_narrow_from_16bit<Src, fp8_e4m3>(src, label);
    check_narrow_from_16bit<Src, fp8_e5m2>(src, label);
  }
  const std::vector<Src> short_source(every.begin(), every.begin() + 80);
  check_narrow_from_16bit_lengths<Src, float>(short_source);
  check_narrow_from_16bit_lengths<Src, bf16>(short_source);
  check_narrow_from_16bit_lengths<Src, fp16>(short_source);
  check_narrow_from_16bit_lengths<Src, fp8_e4m3>(short_source);
  check_narrow_from_16bit_lengths<Src, fp8_e5m2>(short_source);
}

TEST(CpuConvert, NarrowFromBf16MatchesScalarOnEveryCode) {
  check_every_16bit_source<bf16>("bf16");
}

TEST(CpuConvert, NarrowFromF16MatchesScalarOnEveryCode) {
  check_every_16bit_source<fp16>("f16");
}

TEST(CpuConvert, NarrowFrom16BitRefusesOtherSourcesAndStochasticRounding) {
  const uint8_t codes[4] = {};
  uint8_t out[4] = {};
  try {
    narrow_from_16bit(codes, DType::kE4M3, out, DType::kE4M3, 4, NarrowOptions{});
    ADD_FAILURE() << "narrow_from_16bit accepted an E4M3 source";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dtype_name(DType::kE4M3)), std::string::npos) << e.what();
  }
  NarrowOptions stochastic;
  stochastic.stochastic = true;
  EXPECT_THROW(narrow_from_16bit(codes, DType::kBF16, out, DType::kE4M3, 2, stochastic), Error);
}

// --- errors --------------------------------------------------------------------------------

TEST(CpuConvert, RejectsNonFloatDtypes) {
  float f[4] = {};
  int32_t i[4] = {};
  for (DType d : {DType::kI32, DType::kI64, DType::kU8}) {
    try {
      widen_to_f32(i, d, f, 4);
      ADD_FAILURE() << "widen_to_f32 accepted " << dtype_name(d);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("widen_to_f32"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dtype_name(d)), std::string::npos) << e.what();
    }
    try {
      narrow_from_f32(f, i, d, 4, NarrowOptions{});
      ADD_FAILURE() << "narrow_from_f32 accepted " << dtype_name(d);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("narrow_from_f32"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(dtype_name(d)), std::string::npos) << e.what();
    }
  }
}

// ctest runs this file twice, the second time with MANTISSA_CPU_AVX512_CONVERT=0, so that the
// AVX2 code that CPUs without AVX-512 run is tested on this one too.
TEST(CpuConvert, Avx512KernelsFollowCpuAndEnvironment) {
  const char* setting = std::getenv("MANTISSA_CPU_AVX512_CONVERT");
  const bool turned_off = setting != nullptr && std::string(setting) == "0";
  const bool cpu_has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                       __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  EXPECT_EQ(avx512::narrow_enabled(), cpu_has && !turned_off);
  std::printf("stochastic rounding and FP8 rounding: %s code\n",
              avx512::narrow_enabled() ? "AVX-512" : "AVX2");
}

// The switches that turn CPU fast paths off take 0 or 1; anything else is an error that names
// the variable and its value (a misspelt "off" must not leave the path on).
TEST(CpuSwitch, TakesZeroOrOneOnly) {
  const char* variable = "MANTISSA_TEST_CPU_SWITCH";
  unsetenv(variable);
  EXPECT_TRUE(env_switch_on(variable));
  setenv(variable, "1", 1);
  EXPECT_TRUE(env_switch_on(variable));
  setenv(variable, "0", 1);
  EXPECT_FALSE(env_switch_on(variable));
  setenv(variable, "off", 1);
  try {
    env_switch_on(variable);
    ADD_FAILURE() << "\"off\" was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("MANTISSA_TEST_CPU_SWITCH=off"), std::string::npos)
        << e.what();
  }
  unsetenv(variable);
}

}  // namespace
}  // namespace mantissa::core
