#include "models/gpt2/gpt2_decoder.h"

#include <string>

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

GPT2Decoder::GPT2Decoder(GPT2& model, core::Backend& backend)
    : Decoder("GPT2Decoder", backend, model.parameters().named("wte").compute.dtype(),
              model.config().seq_len, model.config().vocab_size),
      config_(model.config()) {
  const train::ParameterStore& params = model.parameters();
  const int64_t C = config_.n_embd;
  const Tensor wte = params.named("wte").compute;
  // A padded wte has rows past vocab_size; no token indexes them and no logit of theirs is
  // sampled, so the decoder sees the first vocab_size rows only.
  wte_ = wte.view(0, Shape{config_.vocab_size, C});
  wpe_ = params.named("wpe").compute;
  ln_f_weight_ = params.named("ln_f.weight").compute;
  ln_f_bias_ = params.named("ln_f.bias").compute;
  for (int64_t i = 0; i < config_.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    auto get = [&](const char* part) { return params.named(h + part).compute; };
    Layer layer{get("ln_1.weight"),
                get("ln_1.bias"),
                get("attn.c_attn.weight"),
                get("attn.c_attn.bias"),
                get("attn.c_proj.weight"),
                get("attn.c_proj.bias"),
                get("ln_2.weight"),
                get("ln_2.bias"),
                get("mlp.c_fc.weight"),
                get("mlp.c_fc.bias"),
                get("mlp.c_proj.weight"),
                get("mlp.c_proj.bias"),
                Tensor::empty(Shape{config_.seq_len, C}, dtype(), backend.device()),
                Tensor::empty(Shape{config_.seq_len, C}, dtype(), backend.device())};
    layers_.push_back(std::move(layer));
  }
}

Tensor GPT2Decoder::layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  core::Backend& be = backend();
  Tensor out = Tensor::empty(x.shape(), dtype(), be.device());
  Tensor mean = Tensor::empty(Shape{x.dim(0)}, DType::kF32, be.device());
  Tensor rstd = Tensor::empty(Shape{x.dim(0)}, DType::kF32, be.device());
  be.layernorm_forward(x, weight, bias, out, mean, rstd);
  return out;
}

Tensor GPT2Decoder::linear_bias(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = linear(x, weight);
  backend().add_bias(y, bias);
  return y;
}

Tensor GPT2Decoder::final_hidden(const Tensor& tokens, int64_t start, bool cached) {
  core::Backend& be = backend();
  const int64_t n = tokens.dim(1), C = config_.n_embd;
  // Positions start, start + 1, ...: the rows of wpe from `start` on.
  Tensor x = Tensor::empty(Shape{1, n, C}, dtype(), be.device());
  be.embedding_forward(tokens, wte_, wpe_.view(start * C, Shape{n, C}), x);

  Tensor residual = x.reshape(Shape{n, C});
  for (Layer& layer : layers_) {
    const Tensor qkv = linear_bias(layernorm(residual, layer.ln_1_weight, layer.ln_1_bias),
                                   layer.attn_weight, layer.attn_bias);
    const Tensor attended =
        attend(qkv, layer.k_cache, layer.v_cache, config_.n_head, start, cached);
    Tensor after_attention = Tensor::empty(Shape{n, C}, dtype(), be.device());
    be.add(residual, linear_bias(attended, layer.attn_proj_weight, layer.attn_proj_bias),
           after_attention);
    const Tensor fc = linear_bias(layernorm(after_attention, layer.ln_2_weight, layer.ln_2_bias),
                                  layer.fc_weight, layer.fc_bias);
    Tensor activated = Tensor::empty(fc.shape(), dtype(), be.device());
    be.gelu_forward(fc, activated);
    residual = Tensor::empty(Shape{n, C}, dtype(), be.device());
    be.add(after_attention, linear_bias(activated, layer.mlp_proj_weight, layer.mlp_proj_bias),
           residual);
  }
  // The cached path needs the next token's logits only: the last row goes through ln_f (and
  // then the tied LM head).
  const int64_t rows = cached ? 1 : n;
  return layernorm(residual.view((n - rows) * C, Shape{rows, C}), ln_f_weight_, ln_f_bias_);
}

}  // namespace mantissa::models
