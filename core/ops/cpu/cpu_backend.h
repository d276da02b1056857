// The CPU backend: what CI, laptops and every test without a GPU run. It reproduces the GPU
// numerics (the same dtype.h conversions, FP32 accumulation, the same scaling rules) and
// is parallelised with OpenMP; GEMMs run OpenBLAS (FP32 operands), the native AVX512-BF16
// kernel or the AVX2 kernel that widens operands to FP32 as it packs them.
//
// The member functions are defined by topic: cpu_backend.cpp (memory), cpu_gemm.cpp (with
// cpu_gemm_scaled.cpp for block-scaled FP8), cpu_quantize_blocks.cpp,
// cpu_elementwise.cpp (casts, amax, bias, residual, GELU), cpu_fp8_scale.cpp, cpu_layernorm.cpp,
// cpu_rmsnorm.cpp, cpu_rope.cpp, cpu_swiglu.cpp, cpu_kv_heads.cpp (Llama-style decoders),
// cpu_attention.cpp (fused), cpu_flash_attention.cpp, cpu_attention_primitives.cpp (the pieces
// core/ops/attention.h composes), cpu_attention_decode.cpp (over a KV cache), cpu_embedding.cpp,
// cpu_cross_entropy.cpp, cpu_optim.cpp (AdamW, norms, non-finite checks), cpu_checksum.cpp. The
// per-element math they share with the CUDA backend is in core/ops/math/.
#pragma once

#include "core/ops/backend.h"

namespace mantissa::core {

class CpuBackend final : public Backend {
 public:
  Device device() const override { return Device::cpu(); }
  // Nothing to wait for, but counted as a GPU's would be (Backend::host_syncs).
  void synchronize() override { ++host_syncs_; }

  void copy(const Tensor& src, Tensor& dst) override;
  void fill(Tensor& dst, float value) override;

  void gemm(const Tensor& a, const Tensor& b, Tensor& c, const GemmParams& params) override;

  void cast(const Tensor& src, Tensor& dst, const CastParams& params) override;
  void amax(const Tensor& x, Tensor& out) override;
  void fp8_scale_from_amax(const Tensor& amax, float fp8_max, int margin, Tensor& scale,
                           Tensor& scale_inv) override;
  void fp8_reduce_scales(const Tensor& amax, float fp8_max, int world_size, Tensor& q,
                         Tensor& w) override;
  void quantize_blocks(const Tensor& src, Tensor& codes, Tensor& scales,
                       const BlockQuantizeParams& p) override;
  std::string unsupported_scale_modes(ScaleMode a, ScaleMode b) const override;

  void add_bias(Tensor& x, const Tensor& bias) override;
  void bias_backward(const Tensor& dout, Tensor& dbias) override;
  void add(const Tensor& a, const Tensor& b, Tensor& out) override;
  void gelu_forward(const Tensor& x, Tensor& out) override;
  void gelu_backward(const Tensor& x, const Tensor& dout, Tensor& dx) override;

  void layernorm_forward(const Tensor& x, const Tensor& gamma, const Tensor& beta, Tensor& out,
                         Tensor& mean, Tensor& rstd) override;
  void layernorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                          const Tensor& mean, const Tensor& rstd, Tensor& dx, Tensor& dgamma,
                          Tensor& dbeta) override;
  void attention_forward(const Tensor& qkv, Tensor& out, Tensor& att, int n_head) override;
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& att, Tensor& dqkv,
                          int n_head) override;
  void split_heads(const Tensor& x, Tensor& out) override;
  void merge_heads(const Tensor& x, Tensor& out) override;
  void causal_softmax_forward(const Tensor& scores, float scale, Tensor& probs) override;
  void causal_softmax_backward(const Tensor& probs, const Tensor& dprobs, float scale,
                               Tensor& dscores) override;
  void flash_attention_forward(const Tensor& qkv, Tensor& out, Tensor& lse, int n_head) override;
  void flash_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out,
                                const Tensor& lse, Tensor& dqkv, int n_head) override;
  std::string unsupported_flash_attention(DType qkv, int64_t head_dim) const override;
  void attention_decode(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, Tensor& out,
                        int n_head, int64_t start) override;
  void rmsnorm_forward(const Tensor& x, const Tensor& gamma, float eps, Tensor& out,
                       Tensor& rstd) override;
  void rmsnorm_backward(const Tensor& dout, const Tensor& x, const Tensor& gamma,
                        const Tensor& rstd, Tensor& dx, Tensor& dgamma) override;
  void rope_forward(const Tensor& x, const Tensor& table, int64_t start, int64_t rotated,
                    Tensor& out) override;
  void rope_backward(const Tensor& dout, const Tensor& table, int64_t start, int64_t rotated,
                     Tensor& dx) override;
  void swiglu_forward(const Tensor& gate_up, Tensor& out) override;
  void swiglu_backward(const Tensor& dout, const Tensor& gate_up, Tensor& dgate_up) override;
  void repeat_kv_heads(const Tensor& qkv, int64_t n_head, int64_t n_kv_head, Tensor& out) override;
  void repeat_kv_heads_backward(const Tensor& dout, int64_t n_head, int64_t n_kv_head,
                                Tensor& dqkv) override;
  void embedding_forward(const Tensor& tokens, const Tensor& wte, const Tensor& wpe,
                         Tensor& out) override;
  void embedding_backward(const Tensor& dout, const Tensor& tokens, Tensor& dwte,
                          Tensor& dwpe) override;
  void softmax_cross_entropy(const Tensor& logits, int64_t valid_cols, const Tensor& targets,
                             Tensor& losses, Tensor* dlogits, float grad_scale) override;

  void adamw(Tensor& params, const Tensor& grads, Tensor& m, Tensor& v, Tensor* compute_copy,
             std::span<const ParamRange> ranges, const AdamWParams& p) override;
  void sum_squares(const Tensor& x, Tensor& out) override;
  void unscale_check_finite(Tensor& x, float inv_scale, Tensor& found,
                            Tensor* first_index) override;
  void checksum(const Tensor& x, Tensor& out) override;
};

}  // namespace mantissa::core
