#include "models/llama/llama_decoder.h"

#include <string>

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

LlamaDecoder::LlamaDecoder(Llama& model, core::Backend& backend)
    : Decoder("LlamaDecoder", backend,
              model.parameters().named("embed_tokens.weight").compute.dtype(),
              model.config().seq_len, model.config().vocab_size),
      config_(model.config()),
      rope_table_(model.rope_table()) {
  const train::ParameterStore& params = model.parameters();
  const int64_t C = config_.n_embd, V = config_.vocab_size;
  const Tensor embed = params.named("embed_tokens.weight").compute;
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
                       Tensor::empty(Shape{config_.seq_len, C}, dtype(), backend.device()),
                       Tensor::empty(Shape{config_.seq_len, C}, dtype(), backend.device())});
  }
}

Tensor LlamaDecoder::rmsnorm(const Tensor& x, const Tensor& weight) {
  core::Backend& be = backend();
  Tensor out = Tensor::empty(x.shape(), dtype(), be.device());
  Tensor rstd = Tensor::empty(Shape{x.dim(0)}, DType::kF32, be.device());
  be.rmsnorm_forward(x, weight, config_.norm_eps, out, rstd);
  return out;
}

Tensor LlamaDecoder::final_hidden(const Tensor& tokens, int64_t start, bool cached) {
  core::Backend& be = backend();
  const int64_t n = tokens.dim(1), C = config_.n_embd;
  const int64_t H = config_.n_head, KV = config_.n_kv_head, D = config_.head_dim();
  Tensor x = Tensor::empty(Shape{1, n, C}, dtype(), be.device());
  be.embedding_forward(tokens, embed_, Tensor(), x);

  Tensor residual = x.reshape(Shape{n, C});
  for (Layer& layer : layers_) {
    // q and k rotated at their positions, in place; then the key/value heads repeated to the
    // multi-head layout the attention (and the cache) reads.
    Tensor qkv = linear(rmsnorm(residual, layer.input_norm), layer.qkv_proj);
    Tensor heads = qkv.reshape(Shape{1, n, H + 2 * KV, D});
    be.rope_forward(heads, rope_table_, start, H + KV, heads);
    Tensor expanded = qkv;
    if (KV != H) {
      expanded = Tensor::empty(Shape{n, 3 * C}, dtype(), be.device());
      Tensor out = expanded.reshape(Shape{1, n, 3 * C});
      be.repeat_kv_heads(qkv.reshape(Shape{1, n, (H + 2 * KV) * D}), H, KV, out);
    }
    const Tensor attended = attend(expanded, layer.k_cache, layer.v_cache, H, start, cached);
    Tensor after_attention = Tensor::empty(Shape{n, C}, dtype(), be.device());
    be.add(residual, linear(attended, layer.o_proj), after_attention);
    const Tensor gate_up =
        linear(rmsnorm(after_attention, layer.post_attention_norm), layer.gate_up_proj);
    Tensor activated = Tensor::empty(Shape{n, gate_up.dim(1) / 2}, dtype(), be.device());
    be.swiglu_forward(gate_up, activated);
    residual = Tensor::empty(Shape{n, C}, dtype(), be.device());
    be.add(after_attention, linear(activated, layer.down_proj), residual);
  }
  // The cached path needs the next token's logits only: the last row goes through the final
  // norm (and then the LM head).
  const int64_t rows = cached ? 1 : n;
  return rmsnorm(residual.view((n - rows) * C, Shape{rows, C}), norm_);
}

}  // namespace mantissa::models
