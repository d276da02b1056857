#include "models/gpt2/generate.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

GPT2Decoder::GPT2Decoder(GPT2& model, core::Backend& backend)
    : config_(model.config()), backend_(backend) {
  const train::ParameterStore& params = model.parameters();
  const int64_t C = config_.n_embd;
  const Tensor wte = params.named("wte").compute;
  dtype_ = wte.dtype();
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
                Tensor::empty(Shape{config_.seq_len, C}, dtype_, backend.device()),
                Tensor::empty(Shape{config_.seq_len, C}, dtype_, backend.device())};
    layers_.push_back(std::move(layer));
  }
}

Tensor GPT2Decoder::append(std::span<const int32_t> tokens) {
  return forward(tokens, true);
}

Tensor GPT2Decoder::full_logits(std::span<const int32_t> tokens) {
  return forward(tokens, false);
}

Tensor GPT2Decoder::layernorm(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor out = Tensor::empty(x.shape(), dtype_, backend_.device());
  Tensor mean = Tensor::empty(Shape{x.dim(0)}, DType::kF32, backend_.device());
  Tensor rstd = Tensor::empty(Shape{x.dim(0)}, DType::kF32, backend_.device());
  backend_.layernorm_forward(x, weight, bias, out, mean, rstd);
  return out;
}

Tensor GPT2Decoder::linear(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  Tensor y = Tensor::empty(Shape{x.dim(0), weight.dim(0)}, dtype_, backend_.device());
  core::GemmParams p;
  p.trans_b = true;
  backend_.gemm(x, weight, y, p);
  backend_.add_bias(y, bias);
  return y;
}

Tensor GPT2Decoder::forward(std::span<const int32_t> tokens, bool cached) {
  core::Backend& be = backend_;
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t start = cached ? length_ : 0;
  const int64_t C = config_.n_embd, H = config_.n_head, V = config_.vocab_size;
  MANTISSA_CHECK(n > 0 && start + n <= capacity(),
                 "GPT2Decoder: " << n << " tokens at position " << start
                                 << " do not fit the window of seq_len " << capacity()
                                 << " (at least one token, and no position past the last)");

  Tensor host_tokens = Tensor::empty(Shape{1, n}, DType::kI32);
  std::memcpy(host_tokens.data(), tokens.data(), tokens.size_bytes());
  Tensor device_tokens = host_tokens;
  if (!be.device().is_cpu()) {
    device_tokens = Tensor::empty(host_tokens.shape(), DType::kI32, be.device());
    be.copy(host_tokens, device_tokens);
  }
  // Positions start, start + 1, ...: the rows of wpe from `start` on.
  Tensor x = Tensor::empty(Shape{1, n, C}, dtype_, be.device());
  be.embedding_forward(device_tokens, wte_, wpe_.view(start * C, Shape{n, C}), x);

  Tensor residual = x.reshape(Shape{n, C});
  for (Layer& layer : layers_) {
    const Tensor qkv = linear(layernorm(residual, layer.ln_1_weight, layer.ln_1_bias),
                              layer.attn_weight, layer.attn_bias);
    Tensor attended = Tensor::empty(Shape{n, C}, dtype_, be.device());
    if (cached) {
      be.attention_decode(qkv, layer.k_cache, layer.v_cache, attended, static_cast<int>(H), start);
    } else {
      // FP32 probabilities: the output uses them unrounded anyway, as training's forward does.
      Tensor att = Tensor::empty(Shape{1, H, n, n}, DType::kF32, be.device());
      Tensor out = attended.reshape(Shape{1, n, C});
      be.attention_forward(qkv.reshape(Shape{1, n, 3 * C}), out, att, static_cast<int>(H));
    }
    Tensor after_attention = Tensor::empty(Shape{n, C}, dtype_, be.device());
    be.add(residual, linear(attended, layer.attn_proj_weight, layer.attn_proj_bias),
           after_attention);
    const Tensor fc = linear(layernorm(after_attention, layer.ln_2_weight, layer.ln_2_bias),
                             layer.fc_weight, layer.fc_bias);
    Tensor activated = Tensor::empty(fc.shape(), dtype_, be.device());
    be.gelu_forward(fc, activated);
    residual = Tensor::empty(Shape{n, C}, dtype_, be.device());
    be.add(after_attention, linear(activated, layer.mlp_proj_weight, layer.mlp_proj_bias),
           residual);
  }

  // The cached path needs the next token's logits only: the last row goes through ln_f and
  // the tied LM head.
  const int64_t rows = cached ? 1 : n;
  const Tensor hidden =
      layernorm(residual.view((n - rows) * C, Shape{rows, C}), ln_f_weight_, ln_f_bias_);
  Tensor logits = Tensor::empty(Shape{rows, V}, DType::kF32, be.device());
  core::GemmParams head;
  head.trans_b = true;
  be.gemm(hidden, wte_, logits, head);
  if (!cached) return logits;
  length_ += n;
  return logits.reshape(Shape{V});
}

}  // namespace mantissa::models
