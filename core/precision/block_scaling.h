// FP8 scaling finer than one scale per tensor: the scale modes of cuBLASLt's block-scaled
// GEMMs, how a block's scale is computed, and where it lives in the scale tensor. One header
// for host and device (MANTISSA_HD, like core/dtype/dtype.h), so that the CPU backend and the
// CUDA kernels quantise to the same bits and read the same layout. The layout is cuBLASLt's
// own, so the GPU hands these tensors to cublasLtMatmul as they are.
//
// Geometry. A GEMM reads each FP8 operand as `outer` rows of K elements, K being the
// contraction: op(A) is [M, K] and op(B)^T is [N, K] (the transposes only say how the codes
// are stored; a scale belongs to a row and a range of K whatever the storage). Element (i, k)
// belongs to K-block b = k / block_k (block_k: 128, 32, or all of K).
//
// Modes (the values are cublasLtMatmulMatrixScale_t's, so the CUDA backend passes them on):
//   kTensor      SCALAR_32F      one F32 for the whole operand (DELAYED and CURRENT)
//   kVec32Ue8m0  VEC32_UE8M0     one E8M0 byte per 1x32 block along K (MXFP8)
//   kOuterVec    OUTER_VEC_32F   one F32 per row, the row being its block (ROWWISE)
//   kVec128      VEC128_32F      one F32 per 1x128 tile along K (BLOCKWISE inputs, gradients)
//   kBlock128    BLK128x128_32F  one F32 per 128x128 block (BLOCKWISE weights)
//
// Scale tensor layouts, with L = ceil(K / block_k) blocks along K and L4 = L rounded up to 4:
//   kTensor      1 element.
//   kOuterVec    outer elements; row i at i.
//   kVec128      outer * L elements, "outer-major": (i, b) at i + b * outer, so one K-block's
//                scales are contiguous. outer must be a multiple of 8 (scale_rows_multiple).
//   kBlock128    L4 * ceil(outer / 128) elements, K-major: (i, b) at b + (i / 128) * L4, each
//                row of blocks padded to a multiple of 4.
//   kVec32Ue8m0  round_up(outer, 128) * L4 bytes in tiles of 128 rows x 4 K-blocks (512
//                bytes), the tiles row-major: tile (i / 128, b / 4) starts at
//                (i / 128 * L4 / 4 + b / 4) * 512, and inside it (i, b) sits at
//                (i % 32) * 16 + (i % 128) / 32 * 4 + b % 4 (the 32x4x4 swizzle that lets a
//                tensor core load the scales of 128 rows at once).
// Padding entries hold the scale of an all-zero block (1; E8M0 127), so that a scale tensor's
// bytes are defined everywhere and two backends' tensors compare bit for bit.
//
// Quantisation of one block with amax = max |x| over it, in the format's largest finite value
// fmt_max (448 for E4M3, 57344 for E5M2):
//   s = amax / fmt_max, the dequantisation factor (DeepSeek-V3's rule): code = round(x / s),
//   value = code * s. The division is FP32 division rounded to nearest (the host's `/`, the
//   device's __fdiv_rn; nothing reorders it), so host and device agree bit for bit.
//   - an all-zero block (amax = 0), or a non-finite amax: s = 1 (a zero block stays exact; in
//     a block with inf or NaN, inf saturates and NaN stays NaN, so the overflow still shows);
//   - power-of-two scales (MXFP8 always, BLOCKWISE and ROWWISE optionally): s is the smallest
//     power of two with amax / s <= fmt_max, which is Transformer Engine's "scale = fmt_max /
//     amax rounded down to a power of two" seen from the other side; x / s is then exact;
//   - a quotient below FP32's normal range (amax < 2^-126 fmt_max, about 5e-36 for E4M3) has
//     lost up to half its precision, which could saturate the block: such blocks take the
//     power-of-two scale whatever the recipe (at least 2^-149, so never a division by zero);
//   - MXFP8 stores s as E8M0 (an exponent e: s = 2^(e - 127), e in [0, 254]), so s is also
//     floored at 2^-127. This is Transformer Engine's MXFP8 rule (exponent of amax / fmt_max
//     rounded up); OCP MX's floor(log2 amax) - emax can saturate a block's largest element.
//   code = x / s rounded to nearest even and saturated to +-fmt_max (round_to, kSatFinite): a
//   quotient just past fmt_max only happens when s itself was rounded down.
#pragma once

#include <cstdint>
#include <string>

#include "core/dtype/dtype.h"
#include "core/int_math.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

enum class ScaleMode : uint8_t {
  kTensor = 0,
  kVec32Ue8m0 = 2,
  kOuterVec = 3,
  kVec128 = 4,
  kBlock128 = 5,
};

// ---------------------------------------------------------------------------------------
// Layout.

// Elements of K per block: 128, 32, or the whole row (kTensor, kOuterVec; at least 1 so
// that K = 0 still has one block).
MANTISSA_HD int64_t scale_block_k(ScaleMode mode, int64_t k) {
  switch (mode) {
    case ScaleMode::kVec128:
    case ScaleMode::kBlock128: return 128;
    case ScaleMode::kVec32Ue8m0: return 32;
    default: return k > 0 ? k : 1;
  }
}

// Rows per block: 128 for kBlock128, all of them for kTensor, else 1.
MANTISSA_HD int64_t scale_block_rows(ScaleMode mode, int64_t outer) {
  switch (mode) {
    case ScaleMode::kBlock128: return 128;
    case ScaleMode::kTensor: return outer > 0 ? outer : 1;
    default: return 1;
  }
}

// What an operand's row count must be a multiple of: 4 for kBlock128 (cuBLASLt's rule), 8 for
// kVec128 (cuBLASLt's 4, and TransformerEngine found that its B operand, which is the backend's
// A, the tokens, needs 8: a multiple of 4 alone found no algorithm), else 1.
MANTISSA_HD int64_t scale_rows_multiple(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::kVec128: return 8;
    case ScaleMode::kBlock128: return 4;
    default: return 1;
  }
}

// L: blocks along K.
MANTISSA_HD int64_t scale_k_blocks(ScaleMode mode, int64_t k) {
  return ceil_div(k, scale_block_k(mode, k));
}

// Elements of the scale tensor of an operand of `outer` rows and K columns, padding included.
MANTISSA_HD int64_t scale_count(ScaleMode mode, int64_t outer, int64_t k) {
  const int64_t blocks = scale_k_blocks(mode, k);
  switch (mode) {
    case ScaleMode::kOuterVec: return outer;
    case ScaleMode::kVec128: return outer * blocks;
    case ScaleMode::kBlock128: return round_up(blocks, 4) * ceil_div(outer, 128);
    case ScaleMode::kVec32Ue8m0: return round_up(outer, 128) * round_up(blocks, 4);
    default: return 1;
  }
}

// Where the scales of row i sit: in every layout K-block b's is at
//   base + (b / 4) per_four + (b % 4) per_one,
// so a loop over one row's blocks finds each without a division.
struct ScaleRowIndex {
  int64_t base, per_four, per_one;
  MANTISSA_HD int64_t operator()(int64_t b) const {
    return base + (b >> 2) * per_four + (b & 3) * per_one;
  }
};

MANTISSA_HD ScaleRowIndex scale_row_index(ScaleMode mode, int64_t outer, int64_t k, int64_t i) {
  const int64_t padded_blocks = round_up(scale_k_blocks(mode, k), 4);  // L4
  switch (mode) {
    case ScaleMode::kOuterVec: return {i, 0, 0};
    case ScaleMode::kVec128: return {i, 4 * outer, outer};
    case ScaleMode::kBlock128: return {(i / 128) * padded_blocks, 4, 1};
    case ScaleMode::kVec32Ue8m0:
      return {(i / 128) * (padded_blocks / 4) * 512 + (i % 32) * 16 + (i % 128) / 32 * 4, 512, 1};
    default: return {0, 0, 0};
  }
}

// Where the scale of row i, K-block b sits.
MANTISSA_HD int64_t scale_index(ScaleMode mode, int64_t outer, int64_t k, int64_t i, int64_t b) {
  return scale_row_index(mode, outer, k, i)(b);
}

// ---------------------------------------------------------------------------------------
// Scale values.

template <class Code>
MANTISSA_HD constexpr float fp8_format_max();
template <>
MANTISSA_HD constexpr float fp8_format_max<fp8_e4m3>() {
  return 448.0f;
}
template <>
MANTISSA_HD constexpr float fp8_format_max<fp8_e5m2>() {
  return 57344.0f;
}

// a / b rounded to nearest even, on either side.
MANTISSA_HD float divide_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// The smallest power of two >= s, for finite s > 0 (subnormals included).
MANTISSA_HD float pow2_at_least(float s) {
  uint32_t bits = float_to_bits(s);
  if (bits >= 0x00800000u) {
    // Normal: a non-zero mantissa moves to the next exponent.
    if ((bits & 0x007FFFFFu) != 0) bits = (bits & 0xFF800000u) + 0x00800000u;
    return bits_to_float(bits);
  }
  // Subnormal: s = bits * 2^-149, and the powers of two are single bits.
  uint32_t p = 1;
  while (p < bits) p <<= 1;
  return bits_to_float(p);
}

// The dequantisation factor of a block whose largest magnitude is amax (see the top).
MANTISSA_HD float block_scale(float amax, float fmt_max, bool power_of_two) {
  const uint32_t abs_bits = float_to_bits(amax) & 0x7FFFFFFFu;
  if (abs_bits == 0 || abs_bits >= kF32InfBits) return 1.0f;
  const float a = bits_to_float(abs_bits);
  const float s = divide_rn(a, fmt_max);
  if (!power_of_two && float_to_bits(s) >= 0x00800000u) return s;
  // The power of two at or above the rounded quotient; one doubling more when rounding had
  // taken the quotient below the power it needs (dividing by a power of two is exact, so the
  // test is too). A quotient below FP32's normal range has lost precision (up to half of
  // it), so it takes this rule too, whatever power_of_two says.
  float p = pow2_at_least(float_to_bits(s) == 0 ? bits_to_float(1u) : s);
  if (divide_rn(a, p) > fmt_max) p *= 2.0f;
  return p;
}

// E8M0: an 8-bit exponent, 2^(e - 127); 0xFF is NaN and never produced here.
MANTISSA_HD float e8m0_to_float(uint8_t e) {
  if (e == 0) return bits_to_float(0x00400000u);  // 2^-127, a subnormal FP32
  if (e == 0xFF) return bits_to_float(0x7FC00000u);
  return bits_to_float(static_cast<uint32_t>(e) << 23);
}

// MXFP8's scale of a block: block_scale with power_of_two, floored at 2^-127, as E8M0.
MANTISSA_HD uint8_t mx_scale_e8m0(float amax, float fmt_max) {
  const uint32_t bits = float_to_bits(block_scale(amax, fmt_max, true));
  if (bits <= 0x00400000u) return 0;  // 2^-127 and below
  return static_cast<uint8_t>(bits >> 23);
}

// The scale stored at `index` of a scale tensor, as an F32 multiplier.
MANTISSA_HD float scale_at(const void* scales, ScaleMode mode, int64_t index) {
  if (mode == ScaleMode::kVec32Ue8m0)
    return e8m0_to_float(static_cast<const uint8_t*>(scales)[index]);
  return static_cast<const float*>(scales)[index];
}

// One element's code: x / s, rounded to nearest even, saturated to the format's largest finite.
template <class Code>
MANTISSA_HD Code quantize_with_scale(float x, float s) {
  return round_to<Code>(divide_rn(x, s), Saturation::kSatFinite);
}

// ---------------------------------------------------------------------------------------
// Host-side descriptions.

// The scale tensor's dtype: U8 (E8M0 bytes) for kVec32Ue8m0, else F32.
inline DType scale_dtype(ScaleMode mode) {
  return mode == ScaleMode::kVec32Ue8m0 ? DType::kU8 : DType::kF32;
}

inline const char* scale_mode_name(ScaleMode mode) {
  switch (mode) {
    case ScaleMode::kTensor: return "tensor (SCALAR_32F)";
    case ScaleMode::kVec32Ue8m0: return "1x32 E8M0 (VEC32_UE8M0)";
    case ScaleMode::kOuterVec: return "per row (OUTER_VEC_32F)";
    case ScaleMode::kVec128: return "1x128 (VEC128_32F)";
    case ScaleMode::kBlock128: return "128x128 (BLK128x128_32F)";
  }
  return "?";
}

// The pairs of operand modes cuBLASLt defines a product for (the CPU takes the same): both
// per tensor, both per row, both MXFP8, or 1x128 with 1x128 or 128x128 on either side (two
// 128x128 operands are not a pair). Returns nullptr for a valid pair, else the rule.
inline const char* scale_mode_pair_rule(ScaleMode a, ScaleMode b) {
  const bool ok = (a == b && a != ScaleMode::kBlock128) ||
                  (a == ScaleMode::kVec128 && b == ScaleMode::kBlock128) ||
                  (a == ScaleMode::kBlock128 && b == ScaleMode::kVec128);
  return ok ? nullptr
            : "scale modes pair as tensor x tensor, per row x per row, 1x32 E8M0 x 1x32 E8M0, "
              "or 1x128 with 1x128 or 128x128 (not 128x128 x 128x128)";
}

// Why a GPU of compute capability `cc` (10 major + minor: 90 for Hopper) has no cuBLASLt FP8
// GEMM whose first operand is scaled by `a` (cuBLAS documentation, CUDA 13): per-tensor scales
// need 8.9 or newer; per-row, 1x128 and 128x128 scales run on 9.x (Hopper) only; MXFP8's 1x32
// E8M0 scales on 10.0 and newer (Blackwell). Empty when it has one; `device` names the GPU.
inline std::string gpu_scale_mode_rule(ScaleMode a, ScaleMode b, int cc,
                                       const std::string& device) {
  switch (a) {
    case ScaleMode::kTensor:
      if (cc >= 89) return "";
      return "FP8 GEMMs need compute capability 8.9 or newer, which " + device + " does not have";
    case ScaleMode::kVec32Ue8m0:
      if (cc >= 100) return "";
      return "MXFP8 (1x32 E8M0) scales run on compute capability 10.0 and newer (Blackwell); " +
             device + " does not have them";
    default:
      if (cc / 10 == 9) return "";
      return std::string(scale_mode_name(a)) + " x " + scale_mode_name(b) +
             " scales run on compute capability 9.0 (Hopper) only; " + device +
             " does not have them";
  }
}

}  // namespace mantissa::core
