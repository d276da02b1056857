#include "models/gpt2/hf_layout.h"

#include <string>

#include "core/json_string.h"
#include "core/ops/math/layernorm.h"

namespace mantissa::models {

HfLayout gpt2_hf_layout(const GPT2Config& c) {
  using Rule = HfConfigField::Rule;
  const std::string prefix = "transformer.";
  HfLayout layout;
  layout.family = "GPT-2";
  layout.architecture = "GPT2LMHeadModel";
  layout.optional_prefix = prefix;
  const int64_t C = c.n_embd;
  auto whole = [&](const std::string& hf, const std::string& ours, int64_t rows, int64_t cols,
                   bool transpose) {
    layout.tensors.push_back({prefix + hf, ours, 0, rows, cols, transpose});
  };
  // The token embedding without the padding rows, which the output projection shares.
  whole("wte.weight", "wte", c.vocab_size, C, false);
  layout.tied_copy = "lm_head.weight";
  layout.tied_to = prefix + "wte.weight";
  whole("wpe.weight", "wpe", c.seq_len, C, false);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    // Linear layers: (name, out, in). Ours are [out, in]; Conv1D's are [in, out].
    const struct {
      const char* name;
      int64_t out, in;
    } linears[] = {{"attn.c_attn", 3 * C, C},
                   {"attn.c_proj", C, C},
                   {"mlp.c_fc", 4 * C, C},
                   {"mlp.c_proj", C, 4 * C}};
    for (const char* ln : {"ln_1", "ln_2"}) {
      whole(h + ln + ".weight", h + ln + ".weight", C, 0, false);
      whole(h + ln + ".bias", h + ln + ".bias", C, 0, false);
    }
    for (const auto& l : linears) {
      whole(h + l.name + ".weight", h + l.name + ".weight", l.out, l.in, true);
      whole(h + l.name + ".bias", h + l.name + ".bias", l.out, 0, false);
    }
    // Causal-mask buffers that older checkpoints (the Hub's gpt2 among them) carry.
    layout.ignored.push_back(prefix + h + "attn.bias");
    layout.ignored.push_back(prefix + h + "attn.masked_bias");
  }
  whole("ln_f.weight", "ln_f.weight", C, 0, false);
  whole("ln_f.bias", "ln_f.bias", C, 0, false);

  // Fallbacks are GPT2Config's defaults (transformers' configuration_gpt2.py).
  layout.config = {
      {"architectures", "[\"GPT2LMHeadModel\"]", Rule::kWritten, "", "null"},
      {"model_type", core::json_quoted("gpt2"), Rule::kEqual, "", ""},
      {"vocab_size", hf_json(c.vocab_size), Rule::kEqual, "model.gpt2.vocab_size", "50257"},
      {"n_positions", hf_json(c.seq_len), Rule::kEqual, "model.gpt2.seq_len", "1024"},
      {"n_ctx", hf_json(c.seq_len), Rule::kWritten, "", "null"},
      {"n_embd", hf_json(c.n_embd), Rule::kEqual, "model.gpt2.n_embd", "768"},
      {"n_layer", hf_json(c.n_layer), Rule::kEqual, "model.gpt2.n_layer", "12"},
      {"n_head", hf_json(c.n_head), Rule::kEqual, "model.gpt2.n_head", "12"},
      // null: 4 n_embd, our MLP's width, which a config may also give as a number.
      {"n_inner", "null", Rule::kEqual, "", "null", hf_json(4 * c.n_embd)},
      {"activation_function", core::json_quoted("gelu_new"), Rule::kEqual, "", "\"gelu_new\""},
      {"layer_norm_epsilon", hf_json(core::kLayerNormEps), Rule::kEqual, "", "1e-05"},
      {"scale_attn_weights", "true", Rule::kEqual, "", "true"},
      {"scale_attn_by_inverse_layer_idx", "false", Rule::kEqual, "", "false"},
      {"reorder_and_upcast_attn", "false", Rule::kEqual, "", "false"},
      {"tie_word_embeddings", "true", Rule::kEqual, "", "true"},
      {"torch_dtype", core::json_quoted("float32"), Rule::kWritten, "", "null"},
  };
  return layout;
}

}  // namespace mantissa::models
