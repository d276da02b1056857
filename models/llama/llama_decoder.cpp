#include "models/llama/llama_decoder.h"

#include <cstring>
#include <string>

#include "core/error.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

LlamaDecoder::LlamaDecoder(Llama& model, core::Backend& backend)
    : config_(model.config()), backend_(backend), rope_table_(model.rope_table()) {
  const train::ParameterStore& params = model.parameters();
  const int64_t C = config_.n_embd, V = config_.vocab_size;
  const Tensor embed = params.named("embed_tokens.weight").compute;
  dtype_ = embed.dtype();
  // The padding rows are never indexed and their logits never sampled.
  embed_ = embed.view(0, Shape{V, C});
  lm_head_ =
      config_.tie_embeddings ? embed_ : params.named("lm_head.weight").compute.view(0, Shape{V, C});
  norm_ = params.named("norm.weight").compute;
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    const std::string prefix = "layers." + std::to_string(i) + ".";
    auto get = [&](const char* part) { return params.named(prefix + part).compute; };
    layers_.push_back({get("input_layernorm.weight"), get("self_attn.qkv_proj.weight"),
                       get("self_attn.o_proj.weight"), get("post_attention_layernorm.weight"),
                       get("mlp.gate_up_proj.weight"), get("mlp.down_proj.weight"),
                       Tensor::empty(Shape{config_.seq_len, C}, dtype_, backend.device()),
                       Tensor::empty(Shape{config_.seq_len, C}, dtype_, backend.device())});
  }
}

Tensor LlamaDecoder::append(std::span<const int32_t> tokens) {
  return forward(tokens, true);
}

Tensor LlamaDecoder::full_logits(std::span<const int32_t> tokens) {
  return forward(tokens, false);
}

Tensor LlamaDecoder::rmsnorm(const Tensor& x, const Tensor& weight) {
  Tensor out = Tensor::empty(x.shape(), dtype_, backend_.device());
  Tensor rstd = Tensor::empty(Shape{x.dim(0)}, DType::kF32, backend_.device());
  backend_.rmsnorm_forward(x, weight, config_.norm_eps, out, rstd);
  return out;
}

Tensor LlamaDecoder::linear(const Tensor& x, const Tensor& weight) {
  Tensor y = Tensor::empty(Shape{x.dim(0), weight.dim(0)}, dtype_, backend_.device());
  core::GemmParams p;
  p.trans_b = true;
  backend_.gemm(x, weight, y, p);
  return y;
}

Tensor LlamaDecoder::forward(std::span<const int32_t> tokens, bool cached) {
  core::Backend& be = backend_;
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t start = cached ? length_ : 0;
  const int64_t C = config_.n_embd, H = config_.n_head, KV = config_.n_kv_head;
  const int64_t D = config_.head_dim(), V = config_.vocab_size;
  MANTISSA_CHECK(n > 0 && start + n <= capacity(),
                 "LlamaDecoder: " << n << " tokens at position " << start
                                  << " do not fit the window of seq_len " << capacity()
                                  << " (at least one token, and no position past the last)");

  Tensor host_tokens = Tensor::empty(Shape{1, n}, DType::kI32);
  std::memcpy(host_tokens.data(), tokens.data(), tokens.size_bytes());
  Tensor device_tokens = host_tokens;
  if (!be.device().is_cpu()) {
    device_tokens = Tensor::empty(host_tokens.shape(), DType::kI32, be.device());
    be.copy(host_tokens, device_tokens);
  }
  Tensor x = Tensor::empty(Shape{1, n, C}, dtype_, be.device());
  be.embedding_forward(device_tokens, embed_, Tensor(), x);

  Tensor residual = x.reshape(Shape{n, C});
  for (Layer& layer : layers_) {
    Tensor qkv = linear(rmsnorm(residual, layer.input_norm), layer.qkv_proj);
    Tensor heads = qkv.reshape(Shape{1, n, H + 2 * KV, D});
    be.rope_forward(heads, rope_table_, start, H + KV, heads);
    Tensor expanded = qkv.reshape(Shape{1, n, (H + 2 * KV) * D});
    if (KV != H) {
      expanded = Tensor::empty(Shape{1, n, 3 * C}, dtype_, be.device());
      be.repeat_kv_heads(qkv.reshape(Shape{1, n, (H + 2 * KV) * D}), H, KV, expanded);
    }
    Tensor attended = Tensor::empty(Shape{n, C}, dtype_, be.device());
    if (cached) {
      be.attention_decode(expanded.reshape(Shape{n, 3 * C}), layer.k_cache, layer.v_cache, attended,
                          static_cast<int>(H), start);
    } else {
      // FP32 probabilities: the output uses them unrounded anyway, as training's forward does.
      Tensor att = Tensor::empty(Shape{1, H, n, n}, DType::kF32, be.device());
      Tensor out = attended.reshape(Shape{1, n, C});
      be.attention_forward(expanded, out, att, static_cast<int>(H));
    }
    Tensor after_attention = Tensor::empty(Shape{n, C}, dtype_, be.device());
    be.add(residual, linear(attended, layer.o_proj), after_attention);
    const Tensor gate_up =
        linear(rmsnorm(after_attention, layer.post_attention_norm), layer.gate_up_proj);
    Tensor activated = Tensor::empty(Shape{n, gate_up.dim(1) / 2}, dtype_, be.device());
    be.swiglu_forward(gate_up, activated);
    residual = Tensor::empty(Shape{n, C}, dtype_, be.device());
    be.add(after_attention, linear(activated, layer.down_proj), residual);
  }

  // The cached path needs the next token's logits only: the last row goes through the final
  // norm and the LM head.
  const int64_t rows = cached ? 1 : n;
  const Tensor hidden = rmsnorm(residual.view((n - rows) * C, Shape{rows, C}), norm_);
  Tensor logits = Tensor::empty(Shape{rows, V}, DType::kF32, be.device());
  core::GemmParams head;
  head.trans_b = true;
  be.gemm(hidden, lm_head_, logits, head);
  if (!cached) return logits;
  length_ += n;
  return logits.reshape(Shape{V});
}

}  // namespace mantissa::models
