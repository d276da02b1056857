#include "core/ops/gemm_checks.h"

#include <algorithm>
#include <climits>
#include <string>

#include "core/error.h"
#include "core/ops/op_checks.h"

namespace mantissa::core {
namespace {

constexpr const char* kOp = "gemm";

void check_dtypes(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p,
                  Device device) {
  const std::initializer_list<DType> floats = {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3,
                                               DType::kE5M2};
  check_operand(kOp, "A", a, device, floats);
  check_operand(kOp, "B", b, device, floats);
  check_operand(kOp, "C", c, device, floats);
  const bool fp8 = is_fp8(a.dtype()) || is_fp8(b.dtype());
  if (fp8) {
    MANTISSA_CHECK(is_fp8(a.dtype()) && is_fp8(b.dtype()),
                   kOp << ": operands A " << a.describe() << " and B " << b.describe()
                       << " mix FP8 with a non-FP8 dtype; an FP8 GEMM takes two FP8 operands");
    MANTISSA_CHECK(a.dtype() != DType::kE5M2 || b.dtype() != DType::kE5M2,
                   kOp << ": operands A " << a.describe() << " and B " << b.describe()
                       << " are both E5M2, a pair no FP8 GEMM supports (as on Hopper); use "
                          "E4M3 for one of them");
  } else {
    MANTISSA_CHECK(a.dtype() == b.dtype(),
                   kOp << ": operands A " << a.describe() << " and B " << b.describe()
                       << " must have the same dtype (only FP8 operands may mix E4M3 and E5M2)");
  }

  const DType out = c.dtype();
  bool ok = false;
  const char* supported = "";
  if (fp8) {
    const bool has_e5m2 = a.dtype() == DType::kE5M2 || b.dtype() == DType::kE5M2;
    ok = out != DType::kF16 && (out != DType::kE5M2 || has_e5m2);
    supported = has_e5m2 ? "f32, bf16, e4m3, e5m2" : "f32, bf16, e4m3";
  } else if (a.dtype() == DType::kBF16) {
    ok = out == DType::kF32 || out == DType::kBF16;
    supported = "f32, bf16";
  } else if (a.dtype() == DType::kF16) {
    ok = out == DType::kF32 || out == DType::kF16;
    supported = "f32, f16";
  } else {
    ok = out == DType::kF32;
    supported = "f32";
  }
  MANTISSA_CHECK(ok, kOp << ": output C " << c.describe() << " cannot be produced from A "
                         << a.describe() << " and B " << b.describe()
                         << " (outputs for these operands: " << supported << ")");
  if (is_fp8(out)) {
    MANTISSA_CHECK(p.beta == 0.0f, kOp << ": beta = " << p.beta << " with FP8 output C "
                                       << c.describe()
                                       << "; an FP8 output cannot be accumulated into, so "
                                          "beta must be 0");
  }
}

// Scales and amax are 1-element F32 tensors on the device, and only mean something for FP8
// tensors.
void check_fp8_scalar(const char* name, const Tensor* scalar, const char* tensor_name,
                      const Tensor& tensor, Device device) {
  if (scalar == nullptr) return;
  check_scalar(kOp, name, *scalar, device);
  MANTISSA_CHECK(is_fp8(tensor.dtype()),
                 kOp << ": " << name << " " << scalar->describe() << " is given but " << tensor_name
                     << " " << tensor.describe() << " is not FP8; it applies to FP8 tensors only");
}

GemmShape check_shapes(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p) {
  const int rank = a.shape().rank();
  MANTISSA_CHECK(rank == 2 || rank == 3, kOp << ": operand A " << a.describe()
                                             << " must have 2 dimensions, or 3 for a batched "
                                                "product [batch, rows, cols]");
  check_rank(kOp, "B", b, rank);
  check_rank(kOp, "C", c, rank);
  GemmShape s;
  if (rank == 3) {
    s.batch = a.dim(0);
    MANTISSA_CHECK(b.dim(0) == s.batch && c.dim(0) == s.batch,
                   kOp << ": batched operands A " << a.describe() << ", B " << b.describe()
                       << " and C " << c.describe() << " must have the same batch size");
  }
  // op(A) is [m, k]: A is stored [m, k], or [k, m] when transposed. Likewise op(B) is [k, n]
  // and B is stored [k, n], or [n, k] when transposed.
  s.m = a.dim(p.trans_a ? -1 : -2);
  s.k = a.dim(p.trans_a ? -2 : -1);
  const int64_t k_b = b.dim(p.trans_b ? -1 : -2);
  s.n = b.dim(p.trans_b ? -2 : -1);
  MANTISSA_CHECK(s.k == k_b, kOp << ": inner dimensions differ: op(A) is [" << s.m << ", " << s.k
                                 << "] (A " << a.describe() << (p.trans_a ? ", transposed" : "")
                                 << ") but op(B) is [" << k_b << ", " << s.n << "] (B "
                                 << b.describe() << (p.trans_b ? ", transposed" : "") << ")");
  check_shape(kOp, "C", c, rank == 3 ? Shape{s.batch, s.m, s.n} : Shape{s.m, s.n});
  // OpenBLAS and cuBLASLt take 32-bit dimensions and batch counts.
  MANTISSA_CHECK(std::max({s.batch, s.m, s.n, s.k}) <= INT_MAX,
                 kOp << ": A " << a.describe() << " and B " << b.describe()
                     << " have a dimension beyond the 32-bit limit of BLAS libraries");
  MANTISSA_CHECK(!overlaps(c, a) && !overlaps(c, b), kOp << ": output C " << c.describe()
                                                         << " overlaps an input (A " << a.describe()
                                                         << ", B " << b.describe() << ")");
  return s;
}

// FP8 tensor-core GEMMs read 16-byte aligned rows: K (the row length of both operands in the
// TN layout they take) and the row length of C in bytes must be multiples of 16. The CPU
// could do without, but refusing the same calls on every backend means that a model which
// trains on the CPU also trains on a GPU. (Where the operands start is checked by the CUDA
// backend, which copies some of them into aligned scratch first.)
void check_fp8_rows(const Tensor& a, const Tensor& b, const Tensor& c, const GemmShape& s) {
  MANTISSA_CHECK(s.k % 16 == 0, kOp << ": FP8 operands A " << a.describe() << " and B "
                                    << b.describe() << " have K = " << s.k
                                    << "; FP8 GEMMs need K to be a multiple of 16 (16-byte "
                                       "aligned rows)");
  const int64_t c_row_bytes = s.n * static_cast<int64_t>(dtype_size(c.dtype()));
  MANTISSA_CHECK(c_row_bytes % 16 == 0,
                 kOp << ": output C " << c.describe() << " of an FP8 GEMM has rows of " << s.n
                     << " elements (" << c_row_bytes
                     << " bytes); FP8 GEMMs need rows that are a multiple of 16 bytes");
}

// A scale tensor of a block-scaled operand (block_scaling.h): present, in the mode's dtype,
// exactly the layout's size; the 1x128 and 128x128 modes also need the operand's rows to be a
// multiple of scale_rows_multiple.
void check_scale_tensor(const char* name, const Tensor* scale, ScaleMode mode, const char* operand,
                        int64_t outer, int64_t k, Device device) {
  MANTISSA_CHECK(scale != nullptr, kOp << ": " << name << " is missing; operand " << operand
                                       << " is scaled " << scale_mode_name(mode)
                                       << ", which needs a scale tensor");
  check_operand(kOp, name, *scale, device, {scale_dtype(mode)});
  const int64_t count = scale_count(mode, outer, k);
  MANTISSA_CHECK(scale->numel() == count,
                 kOp << ": " << name << " " << scale->describe() << " holds " << scale->numel()
                     << " scales; operand " << operand << " read as [" << outer << ", " << k
                     << "] and scaled " << scale_mode_name(mode) << " needs " << count);
  const int64_t rows_multiple = scale_rows_multiple(mode);
  MANTISSA_CHECK(outer % rows_multiple == 0, kOp << ": operand " << operand << " has " << outer
                                                 << " rows; scaled " << scale_mode_name(mode)
                                                 << " it needs a multiple of " << rows_multiple
                                                 << " (cuBLASLt's rule)");
}

// Block-scaled FP8 operands: a pair cuBLASLt defines, 2-D, an F32 or BF16 output (cuBLASLt
// writes no FP8 from them), no fast accumulation (it has none for these modes), and a scale
// tensor for each operand.
void check_block_scales(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p,
                        const GemmShape& s, Device device) {
  const char* a_mode = scale_mode_name(p.a_scale_mode);
  const char* b_mode = scale_mode_name(p.b_scale_mode);
  MANTISSA_CHECK(is_fp8(a.dtype()), kOp << ": scale modes " << a_mode << " x " << b_mode
                                        << " are given but operands A " << a.describe() << " and B "
                                        << b.describe()
                                        << " are not FP8; scale modes apply to FP8 operands");
  const char* rule = scale_mode_pair_rule(p.a_scale_mode, p.b_scale_mode);
  MANTISSA_CHECK(rule == nullptr, kOp << ": scale modes A " << a_mode << " x B " << b_mode
                                      << " are not a pair: " << rule);
  MANTISSA_CHECK(a.shape().rank() == 2, kOp << ": operand A " << a.describe()
                                            << " is batched; block-scaled products are 2-D");
  MANTISSA_CHECK(!p.fast_accumulate, kOp << ": fast_accumulate with scale modes " << a_mode << " x "
                                         << b_mode
                                         << "; block-scaled products accumulate in full FP32");
  MANTISSA_CHECK(c.dtype() == DType::kF32 || c.dtype() == DType::kBF16,
                 kOp << ": output C " << c.describe() << " of a block-scaled product (" << a_mode
                     << " x " << b_mode << ") must be f32 or bf16");
  check_scale_tensor("a_scale", p.a_scale, p.a_scale_mode, "A", s.m, s.k, device);
  check_scale_tensor("b_scale", p.b_scale, p.b_scale_mode, "B", s.n, s.k, device);
}

}  // namespace

GemmShape check_gemm(const Tensor& a, const Tensor& b, const Tensor& c, const GemmParams& p,
                     Device device) {
  check_dtypes(a, b, c, p, device);
  const bool block_scaled =
      p.a_scale_mode != ScaleMode::kTensor || p.b_scale_mode != ScaleMode::kTensor;
  if (!block_scaled) {
    check_fp8_scalar("a_scale", p.a_scale, "operand A", a, device);
    check_fp8_scalar("b_scale", p.b_scale, "operand B", b, device);
  }
  check_fp8_scalar("c_scale", p.c_scale, "output C", c, device);
  check_fp8_scalar("c_amax", p.c_amax, "output C", c, device);
  const GemmShape s = check_shapes(a, b, c, p);
  if (block_scaled) check_block_scales(a, b, c, p, s, device);
  if (is_fp8(a.dtype())) check_fp8_rows(a, b, c, s);
  return s;
}

}  // namespace mantissa::core
