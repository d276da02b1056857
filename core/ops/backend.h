// The operator set of a GPT-2 training step, behind one interface with a CPU and a CUDA
// implementation.
//
// Conventions shared by every op:
//  - Tensors are contiguous and row-major; all operands of one call live on the backend's
//    device. Shapes and dtypes are validated and a mismatch throws core::Error naming the op,
//    the operand and the shapes.
//  - Arithmetic is FP32 internally whatever the storage dtype (reduced-precision inputs are
//    widened exactly, outputs are rounded once, to nearest even).
//  - Scalars that the GPU produces or consumes inside a step (amax, norms, non-finite flags,
//    FP8 scales) are 1-element F32 tensors on the device, so a step needs no host sync until
//    the caller decides to read them. Optional scalars are pointers; nullptr means "none"
//    (a missing scale means 1).
//  - Ops named *_backward accumulate (+=) into parameter gradients and overwrite activation
//    gradients, as documented per op. Every op may run asynchronously on the backend's stream;
//    synchronize() waits for all of them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/dtype/dtype.h"
#include "core/precision/block_scaling.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

enum class Rounding : uint8_t { kNearest, kStochastic };

struct GemmParams {
  bool trans_a = false;  // use A^T (A stored as [K, M] instead of [M, K])
  bool trans_b = false;  // use B^T (B stored as [N, K] instead of [K, N])
  float alpha = 1.0f;
  float beta = 0.0f;  // C = alpha * op(A) op(B) + beta * C
  // Dequantize factors for FP8 operands (value = code * scale), 1-element F32 or nullptr.
  // With a scale mode other than kTensor (core/precision/block_scaling.h) a_scale and b_scale
  // are scale tensors in that mode's layout for op(A) [M, K] and op(B)^T [N, K] (both
  // required; the pairs cuBLASLt allows, 2-D operands, F32 or BF16 C, no fast accumulation,
  // no c_scale or c_amax): every K-block's FP32 partial sum is multiplied by its two scales
  // and accumulated in FP32.
  const Tensor* a_scale = nullptr;
  const Tensor* b_scale = nullptr;
  ScaleMode a_scale_mode = ScaleMode::kTensor;
  ScaleMode b_scale_mode = ScaleMode::kTensor;
  // For an FP8 output: quantize factor (code = round(value * scale)) and max |value| before
  // the scale is applied. beta must be 0 for FP8 output.
  const Tensor* c_scale = nullptr;
  Tensor* c_amax = nullptr;
  // Ask for the fast (less exact) FP8 accumulation path where the device has one.
  bool fast_accumulate = false;
};

// Block quantisation (Backend::quantize_blocks), with the rules of block_scaling.h.
struct BlockQuantizeParams {
  ScaleMode mode = ScaleMode::kVec128;  // any mode but kTensor (cast() scales whole tensors)
  // false: the operand's rows are src's rows (K runs along src's rows); true: they are src's
  // columns (codes = the quantised src^T, K-major either way).
  bool transpose = false;
  bool power_of_two = false;     // power-of-two scales (always for kVec32Ue8m0)
  Tensor* amax = nullptr;        // max |src| over the whole tensor (F32 scalar), when non-null
  bool accumulate_amax = false;  // amax = larger_amax(amax, max |src|) (core/precision/fp8_scale.h)
};

struct CastParams {
  const Tensor* scale = nullptr;  // dst = round(src * scale)
  Tensor* amax = nullptr;         // max |src| (before scaling), written when non-null
  Saturation saturation = Saturation::kSatFinite;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;             // stochastic rounding draws random_u32(seed, element index)
  bool accumulate_amax = false;  // amax = larger_amax(amax, max |src|) (core/precision/fp8_scale.h)
};

struct AdamWParams {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // decoupled: param -= lr * weight_decay * param
  int64_t step = 1;           // 1-based, for bias correction
  float grad_scale = 1.0f;    // gradients are multiplied by this first (unscale, clip)
};

// Elements [offset, offset + numel) of the flat buffers adamw updates; weight_decay says
// whether AdamWParams::weight_decay applies to them (GPT-2 decays matrices, not biases or
// norms).
struct ParamRange {
  int64_t offset = 0;
  int64_t numel = 0;
  bool weight_decay = false;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual Device device() const = 0;
  // Waits until every op queued so far has completed. Each call is one host
  // synchronisation (see host_syncs()).
  virtual void synchronize() = 0;

  // Host synchronisations so far: the times the host waited for this backend's queued work
  // (synchronize(), and anything else the backend itself has to wait on). On a GPU each one
  // drains the pipeline, so a training step should need as few as possible. The CPU backend
  // counts the same calls (its synchronize() has nothing to wait for), so that CPU tests
  // count what a GPU run would wait for.
  int64_t host_syncs() const { return host_syncs_; }

  // --- memory -------------------------------------------------------------------------
  // Copies between any two devices (host<->device included); same dtype and numel.
  // From host memory, the source has been read when copy() returns (it may be reused or
  // freed at once); into host memory, the data is there after the next synchronize()
  // (a device-to-host read is a copy followed by one synchronize(), however many copies).
  virtual void copy(const Tensor& src, Tensor& dst) = 0;
  // Every element set to `value` rounded to the tensor's dtype (I32/I64 take it truncated).
  virtual void fill(Tensor& dst, float value) = 0;

  // --- matrix multiply ----------------------------------------------------------------
  // C[M, N] = alpha * op(A)[M, K] op(B)[K, N] + beta * C, FP32 accumulation. As in BLAS,
  // beta = 0 never reads C and alpha = 0 never reads A and B (NaN there does not propagate).
  // A, B: F32, BF16, F16, or FP8 (E4M3xE4M3, E4M3xE5M2, E5M2xE4M3); C: F32, BF16, F16 or
  // FP8, per the dtype table of core/ops/gemm_checks.h.
  // With 3-D operands [batch, rows, cols] every batch is an independent product
  // (strided-batched; the products of core/ops/attention.h).
  virtual void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmParams& params) = 0;

  // --- conversions --------------------------------------------------------------------
  // dst = round(src * scale) into dst's dtype, any dtype to any float dtype (quantize,
  // dequantize, compute-copy casts), with the input amax fused.
  virtual void cast(const Tensor& src, Tensor& dst, const CastParams& params) = 0;
  // out = max |x| (NaN propagates).
  virtual void amax(const Tensor& x, Tensor& out) = 0;
  // The per-tensor FP8 scale of an amax (F32 scalars; core/precision/fp8_scale.h):
  // scale = fp8_scale_for(amax, scale, fp8_max, margin) (scale holds the old one and keeps it
  // for a zero or non-finite amax), scale_inv = 1 / scale. On the device, so a CURRENT-scaled
  // operand needs no host round trip between its amax and its cast.
  virtual void fp8_scale_from_amax(const Tensor& amax, float fp8_max, int margin, Tensor& scale,
                                   Tensor& scale_inv) = 0;
  // FP8 gradient reduction's pre-scale q and widening scale w of a MAX-reduced amax over
  // world_size ranks (F32 scalars; fp8_reduce_scales_for in core/precision/fp8_scale.h).
  virtual void fp8_reduce_scales(const Tensor& amax, float fp8_max, int world_size, Tensor& q,
                                 Tensor& w) = 0;
  // codes[outer, K] (E4M3 or E5M2) and scales: src[outer, K] (or src[K, outer] with
  // p.transpose), F32, BF16 or F16, quantised block by block in p.mode: one scale per block
  // from the block's amax, each code round(x / scale) (core/precision/block_scaling.h).
  // scales: scale_count(mode, outer, K) elements of scale_dtype(mode), padding set to 1.
  virtual void quantize_blocks(const Tensor& src, Tensor& codes, Tensor& scales,
                               const BlockQuantizeParams& p) = 0;
  // "" when gemm() takes FP8 operands with scale modes a and b on this device, else why not
  // (the pair, the architecture or the library). A GEMM the device cannot run in the asked
  // modes fails; it never falls back to other scales.
  virtual std::string unsupported_scale_modes(ScaleMode a, ScaleMode b) const = 0;

  // --- elementwise --------------------------------------------------------------------
  // x[N, C] += bias[C], in place.
  virtual void add_bias(Tensor& x, const Tensor& bias) = 0;
  // dbias[C] += sum over rows of dout[N, C].
  virtual void bias_backward(const Tensor& dout, Tensor& dbias) = 0;
  // out = a + b (residual connection); out may be a or b, or disjoint from both.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))). out may be
  // x, or disjoint from it.
  virtual void gelu_forward(const Tensor& x, Tensor& out) = 0;
  // dx = dout * gelu'(x) (overwrites dx; dx may be x or dout, or disjoint from both).
  virtual void gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) = 0;

  // --- layers -------------------------------------------------------------------------
  // LayerNorm over the last axis of x[N, C]: FP32 statistics, eps 1e-5. Saves mean[N] and
  // rstd[N] (F32) for the backward.
  virtual void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 Tensor& out, Tensor& mean, Tensor& rstd) = 0;
  // dx overwritten (disjoint from dout and x); dgamma, dbeta accumulated.
  virtual void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                  const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                  Tensor& dgamma, Tensor& dbeta) = 0;

  // Causal multi-head self-attention. qkv[B, T, 3C] holds Q, K, V side by side (head h uses
  // channels [h*D, (h+1)*D) of each, D = C / n_head); out[B, T, C]. att[B, H, T, T] saves
  // the softmax probabilities P for the backward (in any activation dtype: F32 keeps them
  // exact, BF16 halves the largest activation of a training step), zero above the diagonal.
  // Per head: S = Q K^T, P = causal_softmax_forward(S, 1/sqrt(D)) (FP32 math), out = P V
  // with P as saved in att, so the backward (which reads att) is the gradient of what the
  // forward computed. core/ops/attention.h defines the function: its routine composes it from
  // the primitives below and batched gemm calls, storing S, dP and dS in the activation dtype
  // (BF16 in a BF16 step; no FP32 [B, H, T, T] buffer). The CUDA backend runs that routine
  // (cuBLASLt strided-batched GEMMs); the CPU backend runs a fused kernel that rounds at the
  // same points, the same function up to the order of FP32 sums and faster on a CPU.
  virtual void attention_forward(const Tensor& qkv, Tensor& out, Tensor& att, int n_head) = 0;
  // dqkv overwritten.
  virtual void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att,
                                  Tensor& dqkv, int n_head) = 0;
  // The attention primitives (core/ops/attention.h composes them with batched gemm calls).
  // split_heads: x[B, T, P*H*D] (P parts side by side, each H heads of D channels, as qkv's
  // Q | K | V with P = 3) into out[P, B, H, T, D]:
  //   out[p, b, h, t, d] = x[b, t, (p*H + h)*D + d],
  // so that out[p] is one contiguous [B*H, T, D] operand of a batched gemm. Values are
  // converted to out's dtype (a copy when the dtypes agree, exact when out is wider).
  virtual void split_heads(const Tensor& x, Tensor& out) = 0;
  // merge_heads: the inverse permutation (split_heads' backward, and the way per-head results
  // return to rows): x[P, B, H, T, D] into out[B, T, P*H*D], converted to out's dtype.
  virtual void merge_heads(const Tensor& x, Tensor& out) = 0;
  // Causal softmax of square score matrices scores[..., T, T] (any leading axes), row by row:
  // row t sees the columns t2 <= t, and with z = scale * scores (core/ops/math/softmax.h, FP32)
  //   probs[t, t2] = exp(z[t2] - max_{j<=t} z[j]) / sum_{j<=t} exp(z[j] - max)   for t2 <= t,
  //   probs[t, t2] = 0                                                         for t2 > t,
  // whatever scores holds above the diagonal (NaN included); rounded once into probs' dtype.
  // probs may be scores itself (in place) or must be disjoint from it.
  virtual void causal_softmax_forward(const Tensor& scores, float scale, Tensor& probs) = 0;
  // Its backward from the saved probabilities P and their gradient dP, row by row:
  //   dscores[t, t2] = scale * P[t, t2] (dP[t, t2] - sum_{j<=t} P[t, j] dP[t, j])  for t2 <= t,
  // and 0 above the diagonal (whatever dP holds there). dscores may be dprobs itself (in place)
  // and must be disjoint from probs.
  virtual void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale,
                                       Tensor& dscores) = 0;
  // The same causal attention without any [B, H, T, T] matrix (FlashAttention-2, Dao 2023):
  // the forward keeps, per query row t of each head, only the log-sum-exp of its scores,
  //   lse[b, h, t] = log sum_{t2 <= t} exp(scale q_t . k_t2)   (F32 [B, H, T], scale 1/sqrt(D)),
  // and the backward recomputes P = exp(scale Q K^T - lse) block by block. qkv[B, T, 3C] and
  // out[B, T, C] are attention_forward's, and qkv, out, dout and dqkv share one dtype. Scores,
  // softmax and every sum are FP32; the probabilities (and dS in the backward) are rounded to
  // qkv's dtype where they enter a product, as tensor-core operands are. So out is
  // attention_forward's function up to rounding, not bit for bit. Each row's memory is
  // O(T D) instead of O(T^2): the kernels read Q, K, V and write out and lse, nothing more.
  // As with the composed routine's GEMMs, the GPU's tile products multiply masked zeros by
  // the values of other positions of their 64-row tiles, forward and backward, so an inf or
  // NaN can reach rows of its tile that it does not attend to.
  virtual void flash_attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, int n_head) = 0;
  // dqkv overwritten, from dout, the forward's out and lse, and qkv:
  //   delta_t = dout_t . out_t,  P = exp(scale S - lse),  dP = dout V^T,
  //   dS = scale P (dP - delta),  dQ = dS K,  dK = dS^T Q,  dV = P^T dout.
  virtual void flash_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                        const Tensor& lse, Tensor& dqkv, int n_head) = 0;
  // "" when this backend runs flash attention on qkv of this dtype and head size D, else why
  // not (the CUDA kernels take BF16 and F16 with D = 64 or 128 where a block may have the
  // shared memory their backward needs: 123 KiB for 64 (an A100 or Hopper, not sm_86/89),
  // 187 KiB for 128 (Hopper); the CPU takes any).
  virtual std::string unsupported_flash_attention(DType qkv, int64_t head_dim) const = 0;
  // Causal attention of N new positions over a KV cache (text generation, one sequence).
  // qkv[N, 3C] holds their Q, K, V as attention_forward's rows do. Their K and V are first
  // written to rows [start, start + N) of k_cache and v_cache [S, C] (start + N <= S); then
  // the new row i, at position start + i, attends to cache rows [0, start + i] and out[N, C]
  // receives the result. The math is attention_forward's (scale 1/sqrt(D), FP32 softmax), so
  // with caches of qkv's dtype row i equals attention_forward's row start + i up to rounding.
  virtual void attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                                int n_head, int64_t start) = 0;

  // Llama-style decoder layers (per-element math in core/ops/math/rmsnorm.h, rope.h,
  // swiglu.h). RMSNorm over the last axis of x[N, C]: rstd = 1 / sqrt(mean(x^2) + eps) in
  // FP32, out = x * rstd * gamma (no mean, no bias). Saves rstd[N] (F32) for the backward.
  virtual void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& out,
                               Tensor& rstd) = 0;
  // dx overwritten (it may be dout itself); dgamma accumulated.
  virtual void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                const Tensor& rstd, Tensor& dx, Tensor& dgamma) = 0;
  // Rotary position embeddings on x[B, T, H, D]: rows of H heads of D channels (D even) at
  // positions start + t; the first `rotated` heads of each row (0 < rotated <= H) are rotated
  // and the others copied. So the output of a fused q|k|v projection, viewed as
  // [B, T, n_head + 2 n_kv_head, D], has its q and k heads rotated in one call
  // (rotated = n_head + n_kv_head), in place. Hugging Face's rotate_half pairing: channels i
  // and i + D/2 of a head rotate by the angle of their position, read from table[S, D] (F32,
  // cos in channels [0, D/2), sin in [D/2, D); make_rope_table builds it once per run),
  // start + T <= S. out may be x itself.
  virtual void rope_forward(const Tensor& x, const Tensor& table, int64_t start, int64_t rotated,
                            Tensor& out) = 0;
  // dx = dout with its first `rotated` heads rotated by -angle and the others copied
  // (overwritten; it may be dout itself).
  virtual void rope_backward(const Tensor& dout, const Tensor& table, int64_t start,
                             int64_t rotated, Tensor& dx) = 0;
  // SwiGLU on the output of one fused gate|up projection: gate_up[N, 2I] holds gate in
  // columns [0, I) and up in [I, 2I); out[N, I] = silu(gate) * up, silu(g) = g sigmoid(g).
  virtual void swiglu_forward(const Tensor& gate_up, Tensor& out) = 0;
  // dgate_up[N, 2I] overwritten with dgate = dout * up * silu'(gate) and dup = dout *
  // silu(gate); it may be gate_up itself (in place).
  virtual void swiglu_backward(const Tensor& dout, const Tensor& gate_up, Tensor& dgate_up) = 0;
  // Grouped-query attention on top of attention_forward: qkv[B, T, (H + 2 KV) D] holds
  // H = n_head query heads, then KV = n_kv_head key heads and KV value heads (KV divides H);
  // out[B, T, 3 H D] is the multi-head layout attention_forward reads, in which query head h
  // gets key/value head h / (H / KV). A copy: out is exact in any dtype.
  virtual void repeat_kv_heads(const Tensor& qkv, int64_t n_head, int64_t n_kv_head,
                               Tensor& out) = 0;
  // Its backward: dqkv[B, T, (H + 2 KV) D] (overwritten) gets the query gradients of
  // dout[B, T, 3 H D] and, for each key/value head, the sum of the gradients of the H / KV
  // heads that shared it, added in head order in FP32 and rounded once.
  virtual void repeat_kv_heads_backward(const Tensor& dout, int64_t n_head, int64_t n_kv_head,
                                        Tensor& dqkv) = 0;

  // out[B, T, C] = wte[tokens[b, t]] + wpe[t]; tokens I32 [B, T]. A token outside
  // [0, vocab) is a caller's error (the data loaders check every token on the host): the CPU
  // backend throws, naming it and its position; the CUDA backend, which would have to
  // synchronise the host to read the tokens back, writes NaN in its row of out and drops its
  // gradient, so the step's non-finite check skips the step. wpe may be an undefined Tensor: no
  // position table (models whose positions come from RoPE), out = wte[tokens[b, t]].
  virtual void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                 Tensor& out) = 0;
  // dwte and dwpe accumulated; dwpe undefined when forward had no wpe.
  virtual void embedding_backward(const Tensor& dout, const Tensor& tokens, Tensor& dwte,
                                  Tensor& dwpe) = 0;

  // Fused softmax + cross-entropy over logits[N, V] (FP32 math) with I32 targets[N]:
  // losses[N] (F32) = -log softmax(logits)[target]. When dlogits is non-null it is
  // overwritten with (softmax - onehot(target)) * grad_scale (the caller folds 1/N and the
  // loss scale into grad_scale). dlogits may alias logits.
  // Only the first valid_cols columns (1 <= valid_cols <= V) are the vocabulary: the softmax
  // and the loss see those alone, targets must lie in [0, valid_cols), and the columns past
  // them (a padded vocabulary's) get probability 0 and a gradient of exactly 0. Each row's
  // result is bit-identical to the op on a copy of its first valid_cols columns. A target
  // outside the range is treated as embedding_forward treats a bad token: the CPU backend
  // throws, the CUDA backend makes that row's loss and gradient NaN.
  virtual void softmax_cross_entropy(const Tensor& logits, int64_t valid_cols,
                                     const Tensor& targets, Tensor& losses, Tensor* dlogits,
                                     float grad_scale) = 0;

  // --- optimizer and gradient checks ---------------------------------------------------
  // AdamW on FP32 masters with FP32 moments m, v; grads F32 (or BF16) multiplied by
  // grad_scale first. When compute_copy is non-null it receives the updated parameters
  // rounded to its dtype in the same pass. All five are flat buffers of one shape, and only
  // the elements of `ranges` are updated, each range with or without the weight decay: one
  // call (one kernel launch on the GPU per 160 ranges) updates a whole model, where a
  // call per parameter would launch one per tensor after the step's host sync. Ranges lie
  // inside the buffers in increasing order of offset, without overlapping; empty ones are
  // allowed.
  virtual void adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                     Tensor* compute_copy, std::span<const ParamRange> ranges,
                     const AdamWParams& p) = 0;
  // out (F32 scalar) += sum of squares of x, accumulated in FP64 and rounded to FP32 once;
  // callers zero `out` first and call once per tensor for a global norm.
  virtual void sum_squares(const Tensor& x, Tensor& out) = 0;
  // x *= inv_scale in place, and detect non-finite values before scaling: found (F32
  // scalar) is set to 1 if any element is inf or NaN, else left unchanged (so it can be
  // shared by several calls). When first_index (I64 scalar) is non-null it receives the
  // smallest index of a non-finite element, or -1.
  virtual void unscale_check_finite(Tensor& x, float inv_scale, Tensor& found,
                                    Tensor* first_index) = 0;

  // --- replica checks -------------------------------------------------------------------
  // out (I64 scalar) = the checksum of x's bytes (core/ops/math/checksum.h), the same bits on
  // both backends and any thread count. x of any dtype, its data 8-byte aligned.
  virtual void checksum(const Tensor& x, Tensor& out) = 0;

 protected:
  int64_t host_syncs_ = 0;  // incremented by the implementations, see host_syncs()
};

std::unique_ptr<Backend> make_cpu_backend();
// Throws Error when the build has no CUDA or the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device_index);
// True when the build has CUDA and at least one device is visible.
bool cuda_device_available();
// For `mantissa --version`: the CUDA runtime, driver and cuBLASLt versions this process loaded,
// the architectures the kernels were built for and the visible devices; or why there is no
// CUDA backend.
std::string cuda_libraries_description();

}  // namespace mantissa::core
