#include "core/ops/op_checks.h"

#include <cmath>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/strings.h"

namespace mantissa::core {
namespace {

void check_float_operand(const char* op, const char* name, const Tensor& t, Device device) {
  check_operand(op, name, t, device,
                {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2});
}

void check_activation(const char* op, const char* name, const Tensor& t, Device device) {
  check_operand(op, name, t, device, {DType::kF32, DType::kBF16, DType::kF16});
}

// Parameters are read from the FP32 masters or from a reduced-precision compute copy.
void check_parameter(const char* op, const char* name, const Tensor& t, Device device) {
  check_operand(op, name, t, device, {DType::kF32, DType::kBF16, DType::kF16});
}

// A tensor of `rows` rows of `row_name` values, whatever its shape ([N], [B, T], ...).
void check_rows(const char* op, const char* name, const Tensor& t, int64_t rows,
                const char* row_name, const Tensor& of) {
  MANTISSA_CHECK(t.numel() == rows, op << ": operand " << name << " " << t.describe()
                                       << " must hold one " << row_name << " per row of "
                                       << of.describe() << " (" << rows << " values)");
}

// x[..., C] with C > 0, as N rows of C.
LayerNormDims layernorm_rows(const char* op, const Tensor& x) {
  MANTISSA_CHECK(x.shape().rank() >= 1 && x.dim(-1) > 0,
                 op << ": operand x " << x.describe() << " must have a non-empty last axis");
  return {x.numel() / x.dim(-1), x.dim(-1)};
}

// qkv[B, T, 3C] with C divisible by n_head.
AttentionDims attention_dims(const char* op, const Tensor& qkv, int n_head) {
  check_rank(op, "qkv", qkv, 3);
  MANTISSA_CHECK(qkv.dim(2) % 3 == 0, op << ": operand qkv " << qkv.describe()
                                         << " must have 3C channels (Q, K and V side by side)");
  const int64_t C = qkv.dim(2) / 3;
  MANTISSA_CHECK(C > 0, op << ": operand qkv " << qkv.describe() << " has no channels");
  MANTISSA_CHECK(n_head > 0 && C % n_head == 0, op << ": C = " << C << " (from qkv "
                                                   << qkv.describe()
                                                   << ") is not divisible by n_head = " << n_head);
  return {qkv.dim(0), qkv.dim(1), C, n_head, C / n_head};
}

// tokens[B, T] and a table[V, C] (wte or dwte) with a position table[>= T, C] (wpe or dwpe)
// beside it.
EmbeddingDims embedding_dims(const char* op, const Tensor& tokens, const char* table_name,
                             const Tensor& table, const char* positions_name,
                             const Tensor& positions) {
  check_rank(op, "tokens", tokens, 2);
  check_rank(op, table_name, table, 2);
  const int64_t B = tokens.dim(0), T = tokens.dim(1), V = table.dim(0), C = table.dim(1);
  if (!positions.defined()) return {B, T, V, C};  // no position table
  check_rank(op, positions_name, positions, 2);
  MANTISSA_CHECK(positions.dim(1) == C && positions.dim(0) >= T,
                 op << ": operand " << positions_name << " " << positions.describe()
                    << " must have " << C << " channels (as " << table_name << " "
                    << table.describe() << ") and at least " << T << " positions (as tokens "
                    << tokens.describe() << ")");
  return {B, T, V, C};
}

}  // namespace

void check_operand(const char* op, const char* name, const Tensor& t, Device device,
                   std::initializer_list<DType> allowed) {
  MANTISSA_CHECK(t.defined(), op << ": operand " << name << " is an undefined tensor");
  MANTISSA_CHECK(t.device() == device, op << ": operand " << name << " " << t.describe()
                                          << " is not on the backend's device " << device.str());
  bool ok = false;
  for (DType d : allowed) ok = ok || d == t.dtype();
  if (!ok) {
    MANTISSA_FAIL(op << ": operand " << name << " " << t.describe()
                     << " has an unsupported dtype (allowed: " << join(allowed, ", ", dtype_name)
                     << ")");
  }
}

void check_rank(const char* op, const char* name, const Tensor& t, int rank) {
  MANTISSA_CHECK(t.shape().rank() == rank, op << ": operand " << name << " " << t.describe()
                                              << " must have " << rank << " dimensions");
}

void check_same_shape(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b) {
  MANTISSA_CHECK(a.shape() == b.shape(), op << ": operands " << name_a << " " << a.describe()
                                            << " and " << name_b << " " << b.describe()
                                            << " must have the same shape");
}

void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected) {
  MANTISSA_CHECK(t.shape() == expected, op << ": operand " << name << " " << t.describe()
                                           << " must have shape " << expected.str());
}

bool overlaps(const Tensor& x, const Tensor& y) {
  const auto x0 = reinterpret_cast<uintptr_t>(x.data());
  const auto y0 = reinterpret_cast<uintptr_t>(y.data());
  return x.nbytes() > 0 && y.nbytes() > 0 && x0 < y0 + y.nbytes() && y0 < x0 + x.nbytes();
}

void check_disjoint(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                    const Tensor& in) {
  MANTISSA_CHECK(!overlaps(out, in), op << ": " << out_name << " " << out.describe() << " overlaps "
                                        << in_name << " " << in.describe()
                                        << "; the output must not share memory with that input");
}

void check_scalar(const char* op, const char* name, const Tensor& t, Device device, DType dtype) {
  check_operand(op, name, t, device, {dtype});
  MANTISSA_CHECK(t.numel() == 1, op << ": operand " << name << " " << t.describe()
                                    << " must hold exactly one element");
}

void fail_index_out_of_range(const char* op, const char* name, const Tensor& indices,
                             int64_t flat_index, int32_t value, int64_t limit) {
  std::vector<int64_t> position(static_cast<size_t>(indices.shape().rank()));
  int64_t rest = flat_index;
  for (int axis = indices.shape().rank() - 1; axis >= 0; --axis) {
    position[axis] = rest % indices.dim(axis);
    rest /= indices.dim(axis);
  }
  MANTISSA_FAIL(op << ": " << name << " " << value << " at position " << Shape(position).str()
                   << " of " << indices.describe() << " is outside [0, " << limit << ")");
}

// ---------------------------------------------------------------------------------------
// memory

void check_fill(const Tensor& dst, Device device) {
  check_operand("fill", "dst", dst, device,
                {DType::kF32, DType::kBF16, DType::kF16, DType::kE4M3, DType::kE5M2, DType::kI32,
                 DType::kI64, DType::kU8});
}

void check_copy_sizes(const Tensor& src, const Tensor& dst) {
  MANTISSA_CHECK(src.dtype() == dst.dtype() && src.numel() == dst.numel(),
                 "copy: src " << src.describe() << " and dst " << dst.describe()
                              << " differ in dtype or element count");
  // A device-to-device cudaMemcpy of overlapping ranges is undefined; a copy onto itself is
  // a no-op everywhere.
  if (src.data() != dst.data()) check_disjoint("copy", "dst", dst, "src", src);
}

namespace {

// `out` is `in` itself (an op that reads each element before writing it in the same thread
// may run in place on both backends) or shares no byte with it.
void check_same_or_disjoint(const char* op, const char* out_name, const Tensor& out,
                            const char* in_name, const Tensor& in) {
  const bool same = out.data() == in.data() && out.nbytes() == in.nbytes();
  MANTISSA_CHECK(same || !overlaps(out, in),
                 op << ": " << out_name << " " << out.describe() << " overlaps " << in_name << " "
                    << in.describe() << " partly; it must be exactly that tensor or disjoint");
}

}  // namespace

// ---------------------------------------------------------------------------------------
// conversions and elementwise

void check_cast(const Tensor& src, const Tensor& dst, const CastParams& params, Device device) {
  check_float_operand("cast", "src", src, device);
  check_float_operand("cast", "dst", dst, device);
  MANTISSA_CHECK(src.numel() == dst.numel(), "cast: operands src " << src.describe() << " and dst "
                                                                   << dst.describe()
                                                                   << " differ in element count");
  // In place (dst exactly over src, elements of one width) every element is read before it is
  // overwritten, by the same GPU thread or CPU slice. Any other overlap (a shifted range, or
  // elements of another width over the same bytes) has some threads or slices read bytes that
  // others already wrote: a data race on the GPU, and a result that differs between backends.
  const bool in_place =
      src.data() == dst.data() && dtype_size(src.dtype()) == dtype_size(dst.dtype());
  MANTISSA_CHECK(!overlaps(src, dst) || in_place,
                 "cast: dst " << dst.describe() << " overlaps src " << src.describe()
                              << " without aliasing it exactly (same start, same element width)");
  if (params.scale != nullptr) check_scalar("cast", "scale", *params.scale, device);
  if (params.amax != nullptr) check_scalar("cast", "amax", *params.amax, device);
}

void check_amax(const Tensor& x, const Tensor& out, Device device) {
  check_float_operand("amax", "x", x, device);
  check_scalar("amax", "out", out, device);
}

// Three F32 scalars; a format maximum that is finite and positive, a margin in [0, 100] (as
// precision.fp8.margin).
void check_fp8_scale_from_amax(const Tensor& amax, float fp8_max, int margin, const Tensor& scale,
                               const Tensor& scale_inv, Device device) {
  check_scalar("fp8_scale_from_amax", "amax", amax, device);
  check_scalar("fp8_scale_from_amax", "scale", scale, device);
  check_scalar("fp8_scale_from_amax", "scale_inv", scale_inv, device);
  MANTISSA_CHECK(fp8_max > 0.0f && fp8_max < 1e30f,
                 "fp8_scale_from_amax: fp8_max " << fp8_max << " is not a format's maximum");
  MANTISSA_CHECK(margin >= 0 && margin <= 100,
                 "fp8_scale_from_amax: margin " << margin << " outside [0, 100]");
  MANTISSA_CHECK(!overlaps(scale, scale_inv),
                 "fp8_scale_from_amax: scale and scale_inv share memory");
}

void check_fp8_reduce_scales(const Tensor& amax, float fp8_max, int world_size, const Tensor& q,
                             const Tensor& w, Device device) {
  check_scalar("fp8_reduce_scales", "amax", amax, device);
  check_scalar("fp8_reduce_scales", "q", q, device);
  check_scalar("fp8_reduce_scales", "w", w, device);
  MANTISSA_CHECK(fp8_max > 0.0f && fp8_max < 1e30f,
                 "fp8_reduce_scales: fp8_max " << fp8_max << " is not a format's maximum");
  MANTISSA_CHECK(world_size >= 1, "fp8_reduce_scales: world_size " << world_size << " < 1");
  MANTISSA_CHECK(!overlaps(q, w), "fp8_reduce_scales: q and w share memory");
}

// x[N, C] (F32, BF16 or F16) and bias[C] (any of those).
void check_add_bias(const Tensor& x, const Tensor& bias, Device device) {
  check_operand("add_bias", "x", x, device, {DType::kF32, DType::kBF16, DType::kF16});
  check_operand("add_bias", "bias", bias, device, {DType::kF32, DType::kBF16, DType::kF16});
  check_rank("add_bias", "x", x, 2);
  check_shape("add_bias", "bias", bias, Shape{x.dim(1)});
}

// dout[N, C] (F32, BF16 or F16) and dbias[C] (F32).
void check_bias_backward(const Tensor& dout, const Tensor& dbias, Device device) {
  check_operand("bias_backward", "dout", dout, device, {DType::kF32, DType::kBF16, DType::kF16});
  check_operand("bias_backward", "dbias", dbias, device, {DType::kF32});
  check_rank("bias_backward", "dout", dout, 2);
  check_shape("bias_backward", "dbias", dbias, Shape{dout.dim(1)});
}

// a, b and out of one dtype (F32, BF16 or F16) and shape.
void check_add(const Tensor& a, const Tensor& b, const Tensor& out, Device device) {
  check_operand("add", "a", a, device, {DType::kF32, DType::kBF16, DType::kF16});
  check_operand("add", "b", b, device, {a.dtype()});
  check_operand("add", "out", out, device, {a.dtype()});
  check_same_shape("add", "a", a, "b", b);
  check_same_shape("add", "a", a, "out", out);
  check_same_or_disjoint("add", "out", out, "a", a);
  check_same_or_disjoint("add", "out", out, "b", b);
}

// x and out of one dtype (F32, BF16 or F16) and shape.
void check_gelu_forward(const Tensor& x, const Tensor& out, Device device) {
  check_operand("gelu_forward", "x", x, device, {DType::kF32, DType::kBF16, DType::kF16});
  check_operand("gelu_forward", "out", out, device, {x.dtype()});
  check_same_shape("gelu_forward", "x", x, "out", out);
  check_same_or_disjoint("gelu_forward", "out", out, "x", x);
}

// x, dout and dx of one dtype (F32, BF16 or F16) and shape.
void check_gelu_backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Device device) {
  check_operand("gelu_backward", "x", x, device, {DType::kF32, DType::kBF16, DType::kF16});
  check_operand("gelu_backward", "dout", dout, device, {x.dtype()});
  check_operand("gelu_backward", "dx", dx, device, {x.dtype()});
  check_same_shape("gelu_backward", "x", x, "dout", dout);
  check_same_shape("gelu_backward", "x", x, "dx", dx);
  check_same_or_disjoint("gelu_backward", "dx", dx, "x", x);
  check_same_or_disjoint("gelu_backward", "dx", dx, "dout", dout);
}

// ---------------------------------------------------------------------------------------
// layers

LayerNormDims check_layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                      Device device) {
  const char* op = "layernorm_forward";
  check_activation(op, "x", x, device);
  check_activation(op, "out", out, device);
  check_parameter(op, "gamma", gamma, device);
  check_parameter(op, "beta", beta, device);
  check_operand(op, "mean", mean, device, {DType::kF32});
  check_operand(op, "rstd", rstd, device, {DType::kF32});
  const LayerNormDims d = layernorm_rows(op, x);
  check_same_shape(op, "x", x, "out", out);
  check_shape(op, "gamma", gamma, Shape{d.C});
  check_shape(op, "beta", beta, Shape{d.C});
  check_rows(op, "mean", mean, d.N, "mean", x);
  check_rows(op, "rstd", rstd, d.N, "rstd", x);
  return d;
}

LayerNormDims check_layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                       const Tensor& dgamma, const Tensor& dbeta, Device device) {
  const char* op = "layernorm_backward";
  check_activation(op, "dout", dout, device);
  check_activation(op, "x", x, device);
  check_activation(op, "dx", dx, device);
  check_parameter(op, "gamma", gamma, device);
  check_operand(op, "mean", mean, device, {DType::kF32});
  check_operand(op, "rstd", rstd, device, {DType::kF32});
  check_operand(op, "dgamma", dgamma, device, {DType::kF32});
  check_operand(op, "dbeta", dbeta, device, {DType::kF32});
  const LayerNormDims d = layernorm_rows(op, x);
  check_same_shape(op, "dout", dout, "x", x);
  check_same_shape(op, "dx", dx, "x", x);
  check_shape(op, "gamma", gamma, Shape{d.C});
  check_shape(op, "dgamma", dgamma, Shape{d.C});
  check_shape(op, "dbeta", dbeta, Shape{d.C});
  check_rows(op, "mean", mean, d.N, "mean", x);
  check_rows(op, "rstd", rstd, d.N, "rstd", x);
  // dgamma and dbeta are summed from dout and x after dx is written.
  check_disjoint(op, "dx", dx, "dout", dout);
  check_disjoint(op, "dx", dx, "x", x);
  return d;
}

// x, out: F32, BF16 or F16 of one shape [..., C]; gamma[C] a parameter; rstd F32, one per
// row; eps positive. out must not share memory with x (the backward needs x).
LayerNormDims check_rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps,
                                    const Tensor& out, const Tensor& rstd, Device device) {
  const char* op = "rmsnorm_forward";
  check_activation(op, "x", x, device);
  check_activation(op, "out", out, device);
  check_parameter(op, "gamma", gamma, device);
  check_operand(op, "rstd", rstd, device, {DType::kF32});
  MANTISSA_CHECK(std::isfinite(eps) && eps > 0.0f,
                 op << ": eps " << eps << " must be positive and finite");
  const LayerNormDims d = layernorm_rows(op, x);
  check_same_shape(op, "x", x, "out", out);
  check_shape(op, "gamma", gamma, Shape{d.C});
  check_rows(op, "rstd", rstd, d.N, "rstd", x);
  check_disjoint(op, "out", out, "x", x);
  check_disjoint(op, "rstd", rstd, "x", x);
  check_disjoint(op, "rstd", rstd, "out", out);
  return d;
}

// dx may be dout itself (in place); dgamma F32, accumulated.
LayerNormDims check_rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                     const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                                     Device device) {
  const char* op = "rmsnorm_backward";
  check_activation(op, "dout", dout, device);
  check_activation(op, "x", x, device);
  check_activation(op, "dx", dx, device);
  check_parameter(op, "gamma", gamma, device);
  check_operand(op, "rstd", rstd, device, {DType::kF32});
  check_operand(op, "dgamma", dgamma, device, {DType::kF32});
  const LayerNormDims d = layernorm_rows(op, x);
  check_same_shape(op, "dout", dout, "x", x);
  check_same_shape(op, "dx", dx, "x", x);
  check_shape(op, "gamma", gamma, Shape{d.C});
  check_shape(op, "dgamma", dgamma, Shape{d.C});
  check_rows(op, "rstd", rstd, d.N, "rstd", x);
  check_same_or_disjoint(op, "dx", dx, "dout", dout);
  check_disjoint(op, "dx", dx, "x", x);
  check_disjoint(op, "dgamma", dgamma, "dout", dout);
  check_disjoint(op, "dgamma", dgamma, "x", x);
  return d;
}

// in, out: F32, BF16 or F16 of one shape [B, T, H, D], D even; table F32 [S, D] (cos in
// channels [0, D/2), sin in [D/2, D), see make_rope_table) with start + T <= S; rotated in
// [1, H]. out may be in itself (in place).
RopeDims check_rope(const char* op, const Tensor& in, const char* in_name, const Tensor& table,
                    int64_t start, int64_t rotated, const Tensor& out, const char* out_name,
                    Device device) {
  check_activation(op, in_name, in, device);
  check_activation(op, out_name, out, device);
  check_operand(op, "table", table, device, {DType::kF32});
  check_rank(op, in_name, in, 4);
  check_rank(op, "table", table, 2);
  check_same_shape(op, in_name, in, out_name, out);
  const RopeDims d{in.dim(0), in.dim(1), in.dim(2), in.dim(3), start, rotated};
  MANTISSA_CHECK(rotated > 0 && rotated <= d.H,
                 op << ": rotated = " << rotated << " heads is outside [1, " << d.H
                    << "], the heads of " << in_name << " " << in.describe());
  MANTISSA_CHECK(d.D > 0 && d.D % 2 == 0,
                 op << ": operand " << in_name << " " << in.describe()
                    << " must have an even, non-zero head_dim (last axis)");
  MANTISSA_CHECK(table.dim(1) == d.D, op << ": operand table " << table.describe()
                                         << " must have head_dim = " << d.D << " channels (as "
                                         << in_name << " " << in.describe() << ")");
  MANTISSA_CHECK(start >= 0 && start + d.T <= table.dim(0),
                 op << ": positions [" << start << ", " << start + d.T << ") of " << in_name << " "
                    << in.describe() << " are outside the table " << table.describe());
  check_same_or_disjoint(op, out_name, out, in_name, in);
  check_disjoint(op, out_name, out, "table", table);
  return d;
}

namespace {

// gate_up[..., 2I] with I > 0, as N rows.
SwigluDims swiglu_rows(const char* op, const Tensor& gate_up) {
  MANTISSA_CHECK(gate_up.shape().rank() >= 1 && gate_up.dim(-1) > 0 && gate_up.dim(-1) % 2 == 0,
                 op << ": operand gate_up " << gate_up.describe()
                    << " must have an even, non-zero last axis (gate and up side by side)");
  return {gate_up.numel() / gate_up.dim(-1), gate_up.dim(-1) / 2};
}

// gate_up's shape with the last axis halved.
Shape swiglu_out_shape(const Tensor& gate_up) {
  std::vector<int64_t> dims(gate_up.shape().dims().begin(), gate_up.shape().dims().end());
  dims.back() /= 2;
  return Shape(dims);
}

}  // namespace

// gate_up[..., 2I], out[..., I]: F32, BF16 or F16 each; out disjoint from gate_up.
SwigluDims check_swiglu_forward(const Tensor& gate_up, const Tensor& out, Device device) {
  const char* op = "swiglu_forward";
  check_activation(op, "gate_up", gate_up, device);
  check_activation(op, "out", out, device);
  const SwigluDims d = swiglu_rows(op, gate_up);
  check_shape(op, "out", out, swiglu_out_shape(gate_up));
  check_disjoint(op, "out", out, "gate_up", gate_up);
  return d;
}

// dout[..., I], gate_up and dgate_up [..., 2I]; dgate_up may be gate_up itself (in place) and
// shares no memory with dout.
SwigluDims check_swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up,
                                 Device device) {
  const char* op = "swiglu_backward";
  check_activation(op, "dout", dout, device);
  check_activation(op, "gate_up", gate_up, device);
  check_activation(op, "dgate_up", dgate_up, device);
  const SwigluDims d = swiglu_rows(op, gate_up);
  check_shape(op, "dout", dout, swiglu_out_shape(gate_up));
  check_same_shape(op, "dgate_up", dgate_up, "gate_up", gate_up);
  check_same_or_disjoint(op, "dgate_up", dgate_up, "gate_up", gate_up);
  check_disjoint(op, "dgate_up", dgate_up, "dout", dout);
  return d;
}

namespace {

// grouped[B, T, (H + 2 KV) D] against expanded[B, T, 3 H D].
KvHeadsDims kv_heads_dims(const char* op, const char* grouped_name, const Tensor& grouped,
                          int64_t n_head, int64_t n_kv_head, const char* expanded_name,
                          const Tensor& expanded) {
  check_rank(op, grouped_name, grouped, 3);
  MANTISSA_CHECK(
      n_head > 0 && n_kv_head > 0 && n_head % n_kv_head == 0,
      op << ": n_kv_head = " << n_kv_head << " must be positive and divide n_head = " << n_head);
  const int64_t heads = n_head + 2 * n_kv_head;
  MANTISSA_CHECK(grouped.dim(2) > 0 && grouped.dim(2) % heads == 0,
                 op << ": operand " << grouped_name << " " << grouped.describe()
                    << " must have (n_head + 2 n_kv_head) = " << heads << " heads of D channels");
  const KvHeadsDims d{grouped.dim(0), grouped.dim(1), n_head, n_kv_head, grouped.dim(2) / heads};
  check_shape(op, expanded_name, expanded, Shape{d.B, d.T, 3 * d.H * d.D});
  return d;
}

}  // namespace

KvHeadsDims check_repeat_kv_heads(const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                  const Tensor& out, Device device) {
  const char* op = "repeat_kv_heads";
  check_activation(op, "qkv", qkv, device);
  check_activation(op, "out", out, device);
  const KvHeadsDims d = kv_heads_dims(op, "qkv", qkv, n_head, n_kv_head, "out", out);
  check_disjoint(op, "out", out, "qkv", qkv);
  return d;
}

KvHeadsDims check_repeat_kv_heads_backward(const Tensor& dout, int64_t n_head, int64_t n_kv_head,
                                           const Tensor& dqkv, Device device) {
  const char* op = "repeat_kv_heads_backward";
  check_activation(op, "dout", dout, device);
  check_activation(op, "dqkv", dqkv, device);
  const KvHeadsDims d = kv_heads_dims(op, "dqkv", dqkv, n_head, n_kv_head, "dout", dout);
  check_disjoint(op, "dqkv", dqkv, "dout", dout);
  return d;
}

AttentionDims check_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& att,
                                      int n_head, Device device) {
  const char* op = "attention_forward";
  check_activation(op, "qkv", qkv, device);
  check_activation(op, "out", out, device);
  check_activation(op, "att", att, device);
  const AttentionDims d = attention_dims(op, qkv, n_head);
  check_shape(op, "out", out, Shape{d.B, d.T, d.C});
  check_shape(op, "att", att, Shape{d.B, d.H, d.T, d.T});
  check_disjoint(op, "out", out, "qkv", qkv);
  check_disjoint(op, "att", att, "qkv", qkv);
  check_disjoint(op, "att", att, "out", out);
  return d;
}

AttentionDims check_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att,
                                       const Tensor& dqkv, int n_head, Device device) {
  const char* op = "attention_backward";
  check_activation(op, "dout", dout, device);
  check_activation(op, "qkv", qkv, device);
  check_activation(op, "dqkv", dqkv, device);
  check_activation(op, "att", att, device);
  const AttentionDims d = attention_dims(op, qkv, n_head);
  check_shape(op, "dout", dout, Shape{d.B, d.T, d.C});
  check_shape(op, "att", att, Shape{d.B, d.H, d.T, d.T});
  check_same_shape(op, "dqkv", dqkv, "qkv", qkv);
  check_disjoint(op, "dqkv", dqkv, "qkv", qkv);
  check_disjoint(op, "dqkv", dqkv, "dout", dout);
  check_disjoint(op, "dqkv", dqkv, "att", att);
  return d;
}

namespace {

void check_same_dtype(const char* op, const char* name, const Tensor& t, const Tensor& qkv) {
  MANTISSA_CHECK(t.dtype() == qkv.dtype(), op << ": operand " << name << " " << t.describe()
                                              << " must have qkv's dtype ("
                                              << dtype_name(qkv.dtype()) << ")");
}

}  // namespace

AttentionDims check_flash_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                            int n_head, Device device) {
  const char* op = "flash_attention_forward";
  check_activation(op, "qkv", qkv, device);
  check_activation(op, "out", out, device);
  check_operand(op, "lse", lse, device, {DType::kF32});
  const AttentionDims d = attention_dims(op, qkv, n_head);
  check_shape(op, "out", out, Shape{d.B, d.T, d.C});
  check_shape(op, "lse", lse, Shape{d.B, d.H, d.T});
  check_same_dtype(op, "out", out, qkv);
  check_disjoint(op, "out", out, "qkv", qkv);
  check_disjoint(op, "lse", lse, "qkv", qkv);
  check_disjoint(op, "lse", lse, "out", out);
  return d;
}

AttentionDims check_flash_attention_backward(const Tensor& dout, const Tensor& qkv,
                                             const Tensor& out, const Tensor& lse,
                                             const Tensor& dqkv, int n_head, Device device) {
  const char* op = "flash_attention_backward";
  check_activation(op, "dout", dout, device);
  check_activation(op, "qkv", qkv, device);
  check_activation(op, "out", out, device);
  check_activation(op, "dqkv", dqkv, device);
  check_operand(op, "lse", lse, device, {DType::kF32});
  const AttentionDims d = attention_dims(op, qkv, n_head);
  check_shape(op, "dout", dout, Shape{d.B, d.T, d.C});
  check_shape(op, "out", out, Shape{d.B, d.T, d.C});
  check_shape(op, "lse", lse, Shape{d.B, d.H, d.T});
  check_same_shape(op, "dqkv", dqkv, "qkv", qkv);
  check_same_dtype(op, "dout", dout, qkv);
  check_same_dtype(op, "out", out, qkv);
  check_same_dtype(op, "dqkv", dqkv, qkv);
  check_disjoint(op, "dqkv", dqkv, "qkv", qkv);
  check_disjoint(op, "dqkv", dqkv, "dout", dout);
  check_disjoint(op, "dqkv", dqkv, "out", out);
  check_disjoint(op, "dqkv", dqkv, "lse", lse);
  return d;
}

namespace {

// heads[P, B, H, T, D] against rows[B, T, P*H*D].
HeadsDims heads_dims(const char* op, const char* heads_name, const Tensor& heads,
                     const char* rows_name, const Tensor& rows) {
  check_rank(op, heads_name, heads, 5);
  const HeadsDims d{heads.dim(0), heads.dim(1), heads.dim(2), heads.dim(3), heads.dim(4)};
  check_shape(op, rows_name, rows, Shape{d.B, d.T, d.P * d.H * d.D});
  return d;
}

// Score matrices [..., T, T]: at least two axes, the last two equal.
CausalSoftmaxDims score_dims(const char* op, const char* name, const Tensor& t) {
  MANTISSA_CHECK(t.shape().rank() >= 2 && t.dim(-1) == t.dim(-2),
                 op << ": operand " << name << " " << t.describe()
                    << " must be square score matrices [..., T, T]");
  const int64_t T = t.dim(-1);
  return {T == 0 ? 0 : t.numel() / (T * T), T};
}

void check_softmax_scale(const char* op, float scale) {
  MANTISSA_CHECK(std::isfinite(scale), op << ": scale " << scale << " must be finite");
}

}  // namespace

HeadsDims check_split_heads(const Tensor& x, const Tensor& out, Device device) {
  const char* op = "split_heads";
  check_activation(op, "x", x, device);
  check_activation(op, "out", out, device);
  const HeadsDims d = heads_dims(op, "out", out, "x", x);
  check_disjoint(op, "out", out, "x", x);
  return d;
}

HeadsDims check_merge_heads(const Tensor& x, const Tensor& out, Device device) {
  const char* op = "merge_heads";
  check_activation(op, "x", x, device);
  check_activation(op, "out", out, device);
  const HeadsDims d = heads_dims(op, "x", x, "out", out);
  check_disjoint(op, "out", out, "x", x);
  return d;
}

CausalSoftmaxDims check_causal_softmax_forward(const Tensor& scores, float scale,
                                               const Tensor& probs, Device device) {
  const char* op = "causal_softmax_forward";
  check_activation(op, "scores", scores, device);
  check_activation(op, "probs", probs, device);
  check_softmax_scale(op, scale);
  const CausalSoftmaxDims d = score_dims(op, "scores", scores);
  check_same_shape(op, "probs", probs, "scores", scores);
  check_same_or_disjoint(op, "probs", probs, "scores", scores);
  return d;
}

CausalSoftmaxDims check_causal_softmax_backward(const Tensor& probs, const Tensor& dprobs,
                                                float scale, const Tensor& dscores, Device device) {
  const char* op = "causal_softmax_backward";
  check_activation(op, "probs", probs, device);
  check_activation(op, "dprobs", dprobs, device);
  check_activation(op, "dscores", dscores, device);
  check_softmax_scale(op, scale);
  const CausalSoftmaxDims d = score_dims(op, "probs", probs);
  check_same_shape(op, "dprobs", dprobs, "probs", probs);
  check_same_shape(op, "dscores", dscores, "probs", probs);
  check_same_or_disjoint(op, "dscores", dscores, "dprobs", dprobs);
  check_disjoint(op, "dscores", dscores, "probs", probs);
  return d;
}

AttentionDecodeDims check_attention_decode(const Tensor& qkv, const Tensor& k_cache,
                                           const Tensor& v_cache, const Tensor& out, int n_head,
                                           int64_t start, Device device) {
  const char* op = "attention_decode";
  check_activation(op, "qkv", qkv, device);
  check_activation(op, "k_cache", k_cache, device);
  check_activation(op, "v_cache", v_cache, device);
  check_activation(op, "out", out, device);
  check_rank(op, "qkv", qkv, 2);
  MANTISSA_CHECK(qkv.dim(1) % 3 == 0 && qkv.dim(1) > 0,
                 op << ": operand qkv " << qkv.describe()
                    << " must have 3C > 0 channels (Q, K and V side by side)");
  const int64_t N = qkv.dim(0), C = qkv.dim(1) / 3;
  MANTISSA_CHECK(n_head > 0 && C % n_head == 0, op << ": C = " << C << " (from qkv "
                                                   << qkv.describe()
                                                   << ") is not divisible by n_head = " << n_head);
  check_rank(op, "k_cache", k_cache, 2);
  MANTISSA_CHECK(k_cache.dim(1) == C, op << ": operand k_cache " << k_cache.describe()
                                         << " must have " << C << " channels (as qkv "
                                         << qkv.describe() << ")");
  check_same_shape(op, "v_cache", v_cache, "k_cache", k_cache);
  check_shape(op, "out", out, Shape{N, C});
  const int64_t S = k_cache.dim(0);
  MANTISSA_CHECK(start >= 0 && start + N <= S,
                 op << ": positions [" << start << ", " << start + N << ") of qkv "
                    << qkv.describe() << " do not fit the caches " << k_cache.describe()
                    << " (start must be >= 0 and start + N <= " << S << ")");
  check_disjoint(op, "out", out, "qkv", qkv);
  check_disjoint(op, "k_cache", k_cache, "qkv", qkv);
  check_disjoint(op, "v_cache", v_cache, "qkv", qkv);
  check_disjoint(op, "v_cache", v_cache, "k_cache", k_cache);
  check_disjoint(op, "out", out, "k_cache", k_cache);
  check_disjoint(op, "out", out, "v_cache", v_cache);
  return {N, S, C, n_head, C / n_head, start};
}

EmbeddingDims check_embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                      const Tensor& out, Device device) {
  const char* op = "embedding_forward";
  check_operand(op, "tokens", tokens, device, {DType::kI32});
  check_parameter(op, "wte", wte, device);
  if (wpe.defined()) check_parameter(op, "wpe", wpe, device);
  check_activation(op, "out", out, device);
  const EmbeddingDims d = embedding_dims(op, tokens, "wte", wte, "wpe", wpe);
  check_shape(op, "out", out, Shape{d.B, d.T, d.C});
  return d;
}

EmbeddingDims check_embedding_backward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte,
                                       const Tensor& dwpe, Device device) {
  const char* op = "embedding_backward";
  check_activation(op, "dout", dout, device);
  check_operand(op, "tokens", tokens, device, {DType::kI32});
  check_operand(op, "dwte", dwte, device, {DType::kF32});
  if (dwpe.defined()) check_operand(op, "dwpe", dwpe, device, {DType::kF32});
  const EmbeddingDims d = embedding_dims(op, tokens, "dwte", dwte, "dwpe", dwpe);
  check_shape(op, "dout", dout, Shape{d.B, d.T, d.C});
  return d;
}

CrossEntropyDims check_softmax_cross_entropy(const Tensor& logits, int64_t valid_cols,
                                             const Tensor& targets, const Tensor& losses,
                                             const Tensor* dlogits, Device device) {
  const char* op = "softmax_cross_entropy";
  check_activation(op, "logits", logits, device);
  check_operand(op, "targets", targets, device, {DType::kI32});
  check_operand(op, "losses", losses, device, {DType::kF32});
  MANTISSA_CHECK(logits.shape().rank() >= 1 && logits.dim(-1) > 0,
                 op << ": operand logits " << logits.describe()
                    << " must have a non-empty last axis (the vocabulary)");
  const int64_t V = logits.dim(-1);
  const int64_t N = logits.numel() / V;
  MANTISSA_CHECK(valid_cols >= 1 && valid_cols <= V,
                 op << ": valid_cols = " << valid_cols << " must lie in [1, " << V
                    << "], the columns of logits " << logits.describe());
  check_rows(op, "targets", targets, N, "target", logits);
  check_rows(op, "losses", losses, N, "loss", logits);
  if (dlogits != nullptr) {
    check_activation(op, "dlogits", *dlogits, device);
    check_same_shape(op, "logits", logits, "dlogits", *dlogits);
    // In-place is fine row by row, but a partial overlap or a different dtype over the same
    // bytes would read logits that an earlier row already overwrote.
    MANTISSA_CHECK(!overlaps(logits, *dlogits) ||
                       (logits.data() == dlogits->data() && logits.dtype() == dlogits->dtype()),
                   op << ": dlogits " << dlogits->describe() << " overlaps logits "
                      << logits.describe() << " without aliasing it exactly");
  }
  return {N, V};
}

// ---------------------------------------------------------------------------------------
// optimizer and gradient checks

// F32 params, m, v of one shape; grads F32 or BF16 of that shape. compute_copy, when given, is
// F32, BF16 or F16: FP8 would need a scale, so FP8 compute copies are made with cast() and
// are rejected here.
void check_adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                 const Tensor* compute_copy, std::span<const ParamRange> ranges,
                 const AdamWParams& p, Device device) {
  check_operand("adamw", "params", params, device, {DType::kF32});
  check_operand("adamw", "grads", grads, device, {DType::kF32, DType::kBF16});
  check_operand("adamw", "m", m, device, {DType::kF32});
  check_operand("adamw", "v", v, device, {DType::kF32});
  check_same_shape("adamw", "params", params, "grads", grads);
  check_same_shape("adamw", "params", params, "m", m);
  check_same_shape("adamw", "params", params, "v", v);
  if (compute_copy != nullptr) {
    MANTISSA_CHECK(!is_fp8(compute_copy->dtype()),
                   "adamw: operand compute_copy " << compute_copy->describe()
                                                  << " is FP8, which needs a scale; produce FP8 "
                                                     "compute copies with cast() and a scale");
    check_operand("adamw", "compute_copy", *compute_copy, device,
                  {DType::kF32, DType::kBF16, DType::kF16});
    check_same_shape("adamw", "params", params, "compute_copy", *compute_copy);
  }
  int64_t covered_to = 0;  // the end of the previous range
  for (const ParamRange& r : ranges) {
    MANTISSA_CHECK(r.offset >= covered_to && r.numel >= 0 && r.numel <= params.numel() - r.offset,
                   "adamw: the range of " << r.numel << " elements at offset " << r.offset
                                          << " is not inside params " << params.describe()
                                          << " after the previous range, which ends at "
                                          << covered_to);
    covered_to = r.offset + r.numel;
  }
  MANTISSA_CHECK(p.step >= 1, "adamw: step " << p.step << " must be >= 1 (it is 1-based)");
  MANTISSA_CHECK(p.beta1 >= 0.0f && p.beta1 < 1.0f,
                 "adamw: beta1 " << p.beta1 << " must be in [0, 1)");
  MANTISSA_CHECK(p.beta2 >= 0.0f && p.beta2 < 1.0f,
                 "adamw: beta2 " << p.beta2 << " must be in [0, 1)");
}

// x F32, BF16 or F16; out an F32 scalar.
void check_sum_squares(const Tensor& x, const Tensor& out, Device device) {
  check_operand("sum_squares", "x", x, device, {DType::kF32, DType::kBF16, DType::kF16});
  check_scalar("sum_squares", "out", out, device);
}

// x F32, BF16 or F16; found an F32 scalar, first_index an I64 one; inv_scale finite.
void check_unscale_check_finite(const Tensor& x, float inv_scale, const Tensor& found,
                                const Tensor* first_index, Device device) {
  check_operand("unscale_check_finite", "x", x, device, {DType::kF32, DType::kBF16, DType::kF16});
  check_scalar("unscale_check_finite", "found", found, device);
  if (first_index != nullptr) {
    check_scalar("unscale_check_finite", "first_index", *first_index, device, DType::kI64);
  }
  MANTISSA_CHECK(std::isfinite(inv_scale),
                 "unscale_check_finite: inv_scale " << inv_scale << " is not finite");
}

// x of any dtype on the device, 8-byte aligned (the GPU reads whole words); out an I64 scalar.
void check_checksum(const Tensor& x, const Tensor& out, Device device) {
  MANTISSA_CHECK(x.defined(), "checksum: operand x is an undefined tensor");
  MANTISSA_CHECK(x.device() == device, "checksum: operand x " << x.describe()
                                                              << " is not on the backend's device "
                                                              << device.str());
  MANTISSA_CHECK(reinterpret_cast<uintptr_t>(x.data()) % 8 == 0,
                 "checksum: operand x " << x.describe() << " does not start on an 8-byte boundary");
  check_scalar("checksum", "out", out, device, DType::kI64);
}

}  // namespace mantissa::core
