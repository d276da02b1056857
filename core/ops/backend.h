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

#include "core/dtype/dtype.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

enum class Rounding : uint8_t { kNearest, kStochastic };

struct GemmParams {
  bool trans_a = false;  // use A^T (A stored as [K, M] instead of [M, K])
  bool trans_b = false;  // use B^T (B stored as [N, K] instead of [K, N])
  float alpha = 1.0f;
  float beta = 0.0f;  // C = alpha * op(A) op(B) + beta * C
  // Dequantize factors for FP8 operands (value = code * scale), 1-element F32 or nullptr.
  const Tensor* a_scale = nullptr;
  const Tensor* b_scale = nullptr;
  // For an FP8 output: quantize factor (code = round(value * scale)) and max |value| before
  // the scale is applied. beta must be 0 for FP8 output.
  const Tensor* c_scale = nullptr;
  Tensor* c_amax = nullptr;
  // Ask for the fast (less exact) FP8 accumulation path where the device has one.
  bool fast_accumulate = false;
};

struct CastParams {
  const Tensor* scale = nullptr;  // dst = round(src * scale)
  Tensor* amax = nullptr;         // max |src| (before scaling), written when non-null
  Saturation saturation = Saturation::kSatFinite;
  Rounding rounding = Rounding::kNearest;
  uint64_t seed = 0;  // stochastic rounding draws random_u32(seed, element index)
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
  // C[M, N] = alpha * op(A)[M, K] op(B)[K, N] + beta * C, FP32 accumulation.
  // A, B: F32, BF16, F16, or FP8 (E4M3xE4M3, E4M3xE5M2, E5M2xE4M3); C: F32, BF16, F16 or
  // FP8, per the dtype table of core/ops/gemm_checks.h.
  // With 3-D operands [batch, rows, cols] every batch is an independent product
  // (strided-batched; used by attention).
  virtual void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmParams& params) = 0;

  // --- conversions --------------------------------------------------------------------
  // dst = round(src * scale) into dst's dtype, any dtype to any float dtype (quantize,
  // dequantize, compute-copy casts), with the input amax fused.
  virtual void cast(const Tensor& src, Tensor& dst, const CastParams& params) = 0;
  // out = max |x| (NaN propagates).
  virtual void amax(const Tensor& x, Tensor& out) = 0;

  // --- elementwise --------------------------------------------------------------------
  // x[N, C] += bias[C], in place.
  virtual void add_bias(Tensor& x, const Tensor& bias) = 0;
  // dbias[C] += sum over rows of dout[N, C].
  virtual void bias_backward(const Tensor& dout, Tensor& dbias) = 0;
  // out = a + b (residual connection); out may alias a or b.
  virtual void add(const Tensor& a, const Tensor& b, Tensor& out) = 0;
  // GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
  virtual void gelu_forward(const Tensor& x, Tensor& out) = 0;
  // dx = dout * gelu'(x) (overwrites dx).
  virtual void gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) = 0;

  // --- layers -------------------------------------------------------------------------
  // LayerNorm over the last axis of x[N, C]: FP32 statistics, eps 1e-5. Saves mean[N] and
  // rstd[N] (F32) for the backward.
  virtual void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                                 Tensor& out, Tensor& mean, Tensor& rstd) = 0;
  // dx overwritten; dgamma, dbeta accumulated.
  virtual void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                                  const Tensor& mean, const Tensor& rstd, Tensor& dx,
                                  Tensor& dgamma, Tensor& dbeta) = 0;

  // Causal multi-head self-attention. qkv[B, T, 3C] holds Q, K, V side by side (head h uses
  // channels [h*D, (h+1)*D) of each, D = C / n_head); out[B, T, C]. att[B, H, T, T] saves
  // the softmax probabilities for the backward (in any activation dtype: F32 keeps them
  // exact, BF16 halves the largest activation of a training step); scores are scaled by
  // 1/sqrt(D), the softmax is computed in FP32 and out uses the unrounded probabilities.
  virtual void attention_forward(const Tensor& qkv, Tensor& out, Tensor& att, int n_head) = 0;
  // dqkv overwritten.
  virtual void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att,
                                  Tensor& dqkv, int n_head) = 0;
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

  // out[B, T, C] = wte[tokens[b, t]] + wpe[t]; tokens I32 [B, T]. A token outside
  // [0, vocab) is an error.
  virtual void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                                 Tensor& out) = 0;
  // dwte and dwpe accumulated.
  virtual void embedding_backward(const Tensor& dout, const Tensor& tokens, Tensor& dwte,
                                  Tensor& dwpe) = 0;

  // Fused softmax + cross-entropy over logits[N, V] (FP32 math) with I32 targets[N]:
  // losses[N] (F32) = -log softmax(logits)[target]. When dlogits is non-null it is
  // overwritten with (softmax - onehot(target)) * grad_scale (the caller folds 1/N and the
  // loss scale into grad_scale). dlogits may alias logits.
  // Only the first valid_cols columns (1 <= valid_cols <= V) are the vocabulary: the softmax
  // and the loss see those alone, targets must lie in [0, valid_cols), and the columns past
  // them (a padded vocabulary's) get probability 0 and a gradient of exactly 0. Each row's
  // result is bit-identical to the op on a copy of its first valid_cols columns.
  virtual void softmax_cross_entropy(const Tensor& logits, int64_t valid_cols,
                                     const Tensor& targets, Tensor& losses, Tensor* dlogits,
                                     float grad_scale) = 0;

  // --- optimizer and gradient checks ---------------------------------------------------
  // AdamW on FP32 masters with FP32 moments m, v; grads F32 (or BF16) multiplied by
  // grad_scale first. When compute_copy is non-null it receives the updated parameters
  // rounded to its dtype in the same pass.
  virtual void adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v,
                     Tensor* compute_copy, const AdamWParams& p) = 0;
  // out (F32 scalar) += sum of squares of x, accumulated in FP64 and rounded to FP32 once;
  // callers zero `out` first and call once per tensor for a global norm.
  virtual void sum_squares(const Tensor& x, Tensor& out) = 0;
  // x *= inv_scale in place, and detect non-finite values before scaling: found (F32
  // scalar) is set to 1 if any element is inf or NaN, else left unchanged (so it can be
  // shared by several calls). When first_index (I64 scalar) is non-null it receives the
  // smallest index of a non-finite element, or -1.
  virtual void unscale_check_finite(Tensor& x, float inv_scale, Tensor& found,
                                    Tensor* first_index) = 0;

 protected:
  int64_t host_syncs_ = 0;  // incremented by the implementations, see host_syncs()
};

std::unique_ptr<Backend> make_cpu_backend();
// Throws Error when the build has no CUDA or the device does not exist.
std::unique_ptr<Backend> make_cuda_backend(int device_index);
// True when the build has CUDA and at least one device is visible.
bool cuda_device_available();

}  // namespace mantissa::core
