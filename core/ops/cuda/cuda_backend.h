// The CUDA backend: cuBLASLt for every GEMM, hand-written kernels for the rest. All work is
// queued on one stream owned by the backend; nothing synchronises unless asked to.
// The constructor makes its device the calling thread's current device and no op sets it
// again: one backend per thread (one rank per GPU), as the trainer runs it.
//
// The member functions are defined by topic, mirroring the CPU backend: cuda_backend.cu
// (construction, memory), cuda_gemm.cu, cuda_quantize_blocks.cu, cuda_elementwise.cu,
// cuda_layernorm.cu, cuda_rmsnorm.cu, cuda_rope.cu, cuda_swiglu.cu, cuda_kv_heads.cu (Llama-style
// decoders), cuda_attention.cu (core/ops/attention.h's routine and its primitives),
// cuda_flash_attention.cu, cuda_attention_decode.cu (over a KV cache), cuda_embedding.cu,
// cuda_cross_entropy.cu, cuda_fp8_scale.cu, cuda_optim.cu, cuda_checksum.cu.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <memory>
#include <optional>

#include "core/ops/backend.h"
#include "core/ops/cuda/cuda_handles.h"

namespace mantissa::core {

class CublasLtGemm;  // cuda_gemm.cu: handle, workspace, per-shape algorithm cache

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(int device_index);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::cuda(device_index_); }
  void synchronize() override;
  cudaStream_t stream() const { return stream_->get(); }
  // Compute capability as major * 10 + minor (80 for A100, 90 for H100/H200).
  int compute_capability() const { return compute_capability_; }
  int multiprocessor_count() const { return multiprocessor_count_; }

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

 private:
  int device_index_;
  // "cuda:N (name, compute capability X.Y)", for messages: cudaGetDeviceProperties takes
  // milliseconds, too long to call per op.
  std::string description_;
  int compute_capability_ = 0;
  int multiprocessor_count_ = 0;
  // Shared memory a block may have with the opt-in attribute (above the default 48 KB): the
  // flash-attention and staged cross-entropy kernels fit or not by it. Read once, here, not
  // per call.
  int max_shared_per_block_ = 0;
  // Made once the device is chosen; declared before gemm_, so released after its workspace.
  std::optional<CudaStream> stream_;
  std::unique_ptr<CublasLtGemm> gemm_;
};

}  // namespace mantissa::core
