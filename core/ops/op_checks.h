// Argument validation shared by every backend, so that a bad call fails the same way (with
// the op, the operand and the shapes named, in the same words) on the CPU and on the GPU.
//
// The per-op validators below run all of an op's checks in one fixed order and return the
// dimensions the op's loops or kernels need; each backend calls the one for its op before
// doing any work. (gemm's lives in gemm_checks.h.) Only what needs the data itself is left to
// the backends: the CPU backend checks token and target ranges and reports through
// fail_index_out_of_range, after the validator; the CUDA backend does not read indices back
// (that would synchronise the host) and turns an out-of-range index into NaN (backend.h).
#pragma once

#include <cstdint>
#include <initializer_list>

#include "core/ops/backend.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

// --- building blocks ----------------------------------------------------------------------

// `t` is defined, lives on `device`, and has one of the `allowed` dtypes.
void check_operand(const char* op, const char* name, const Tensor& t, Device device,
                   std::initializer_list<DType> allowed);
void check_rank(const char* op, const char* name, const Tensor& t, int rank);
void check_same_shape(const char* op, const char* name_a, const Tensor& a, const char* name_b,
                      const Tensor& b);
void check_shape(const char* op, const char* name, const Tensor& t, const Shape& expected);
// True when x and y (both non-empty) share a byte.
bool overlaps(const Tensor& x, const Tensor& y);
// `out` shares no byte with `in`: an op whose kernels write out while other threads still read
// in would otherwise give results that depend on the backend and the schedule.
void check_disjoint(const char* op, const char* out_name, const Tensor& out, const char* in_name,
                    const Tensor& in);
// A 1-element F32 tensor on `device` (scales, amax, norms, flags); I64 with `dtype`.
void check_scalar(const char* op, const char* name, const Tensor& t, Device device,
                  DType dtype = DType::kF32);

// The error for element `flat_index` of `indices` (tokens or targets), holding `value`, being
// outside [0, limit): names the value and its position unravelled over the shape ([b, t]).
[[noreturn]] void fail_index_out_of_range(const char* op, const char* name, const Tensor& indices,
                                          int64_t flat_index, int32_t value, int64_t limit);

// --- memory -------------------------------------------------------------------------------

void check_fill(const Tensor& dst, Device device);
// The part of copy's contract every backend shares; which devices may be copied between is
// the backend's own.
void check_copy_sizes(const Tensor& src, const Tensor& dst);

// --- conversions and elementwise ------------------------------------------------------------

void check_cast(const Tensor& src, const Tensor& dst, const CastParams& params, Device device);
void check_amax(const Tensor& x, const Tensor& out, Device device);
void check_fp8_scale_from_amax(const Tensor& amax, float fp8_max, int margin, const Tensor& scale,
                               const Tensor& scale_inv, Device device);
void check_fp8_reduce_scales(const Tensor& amax, float fp8_max, int world_size, const Tensor& q,
                             const Tensor& w, Device device);
void check_add_bias(const Tensor& x, const Tensor& bias, Device device);
void check_bias_backward(const Tensor& dout, const Tensor& dbias, Device device);
void check_add(const Tensor& a, const Tensor& b, const Tensor& out, Device device);
void check_gelu_forward(const Tensor& x, const Tensor& out, Device device);
void check_gelu_backward(const Tensor& x, const Tensor& dout, const Tensor& dx, Device device);

// --- layers -------------------------------------------------------------------------------

// x viewed as N rows of C channels (C = the last axis).
struct LayerNormDims {
  int64_t N, C;
};
LayerNormDims check_layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                      const Tensor& out, const Tensor& mean, const Tensor& rstd,
                                      Device device);
LayerNormDims check_layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                       const Tensor& mean, const Tensor& rstd, const Tensor& dx,
                                       const Tensor& dgamma, const Tensor& dbeta, Device device);

// Llama-style decoder layers (rmsnorm, rope, swiglu): x viewed as N rows of C channels for
// RMSNorm; rows of H heads of D channels at positions [start, start + T) for RoPE; rows of
// 2I fused gate|up channels for SwiGLU. check_rope serves rope_forward (in x, out out) and
// rope_backward (in dout, out dx); the first R = rotated heads of each row are rotated.
LayerNormDims check_rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps,
                                    const Tensor& out, const Tensor& rstd, Device device);
LayerNormDims check_rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                     const Tensor& rstd, const Tensor& dx, const Tensor& dgamma,
                                     Device device);
struct RopeDims {
  int64_t B, T, H, D, start, R;
};
RopeDims check_rope(const char* op, const Tensor& in, const char* in_name, const Tensor& table,
                    int64_t start, int64_t rotated, const Tensor& out, const char* out_name,
                    Device device);
struct SwigluDims {
  int64_t N, I;
};
SwigluDims check_swiglu_forward(const Tensor& gate_up, const Tensor& out, Device device);
SwigluDims check_swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up,
                                 Device device);

// qkv[B, T, (H + 2 KV) D] (H = n_head query heads, KV = n_kv_head key and value heads of D
// channels) and its multi-head expansion [B, T, 3 H D].
struct KvHeadsDims {
  int64_t B, T, H, KV, D;
};
KvHeadsDims check_repeat_kv_heads(const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                                  const Tensor& out, Device device);
KvHeadsDims check_repeat_kv_heads_backward(const Tensor& dout, int64_t n_head, int64_t n_kv_head,
                                           const Tensor& dqkv, Device device);

// qkv[B, T, 3C] with H = n_head heads of D = C / H channels.
struct AttentionDims {
  int64_t B, T, C, H, D;
};
AttentionDims check_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& att,
                                      int n_head, Device device);
AttentionDims check_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att,
                                       const Tensor& dqkv, int n_head, Device device);

// Flash attention: qkv, out, dout and dqkv of one dtype; lse[B, H, T] F32.
AttentionDims check_flash_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                            int n_head, Device device);
AttentionDims check_flash_attention_backward(const Tensor& dout, const Tensor& qkv,
                                             const Tensor& out, const Tensor& lse,
                                             const Tensor& dqkv, int n_head, Device device);

// The attention primitives: rows[B, T, P*H*D] and their heads[P, B, H, T, D] (split_heads
// reads rows and writes heads, merge_heads the reverse); square score matrices [..., T, T],
// N of them.
struct HeadsDims {
  int64_t P, B, H, T, D;
};
HeadsDims check_split_heads(const Tensor& x, const Tensor& out, Device device);
HeadsDims check_merge_heads(const Tensor& x, const Tensor& out, Device device);
struct CausalSoftmaxDims {
  int64_t N, T;
};
CausalSoftmaxDims check_causal_softmax_forward(const Tensor& scores, float scale,
                                               const Tensor& probs, Device device);
CausalSoftmaxDims check_causal_softmax_backward(const Tensor& probs, const Tensor& dprobs,
                                                float scale, const Tensor& dscores, Device device);

// qkv[N, 3C] (N new positions, H = n_head heads of D = C / H channels) against caches [S, C]
// of which rows [0, start + N) are used.
struct AttentionDecodeDims {
  int64_t N, S, C, H, D, start;
};
AttentionDecodeDims check_attention_decode(const Tensor& qkv, const Tensor& k_cache,
                                           const Tensor& v_cache, const Tensor& out, int n_head,
                                           int64_t start, Device device);

// tokens[B, T] into a table of V rows of C channels.
struct EmbeddingDims {
  int64_t B, T, V, C;
};
EmbeddingDims check_embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                      const Tensor& out, Device device);
EmbeddingDims check_embedding_backward(const Tensor& dout, const Tensor& tokens, const Tensor& dwte,
                                       const Tensor& dwpe, Device device);

// logits viewed as N rows of V columns; the first valid_cols of them, in [1, V], are the
// vocabulary (the rest padding).
struct CrossEntropyDims {
  int64_t N, V;
};
CrossEntropyDims check_softmax_cross_entropy(const Tensor& logits, int64_t valid_cols,
                                             const Tensor& targets, const Tensor& losses,
                                             const Tensor* dlogits, Device device);

// --- optimizer and gradient checks -----------------------------------------------------------

// The ranges inside params, in increasing order, not overlapping; steps and betas in range.
void check_adamw(const Tensor& params, const Tensor& grads, const Tensor& m, const Tensor& v,
                 const Tensor* compute_copy, std::span<const ParamRange> ranges,
                 const AdamWParams& p, Device device);
void check_sum_squares(const Tensor& x, const Tensor& out, Device device);
void check_unscale_check_finite(const Tensor& x, float inv_scale, const Tensor& found,
                                const Tensor* first_index, Device device);

// --- replica checks ----------------------------------------------------------------------------
void check_checksum(const Tensor& x, const Tensor& out, Device device);

}  // namespace mantissa::core
