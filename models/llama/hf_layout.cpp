#include "models/llama/hf_layout.h"

#include <string>

#include "core/json_string.h"

namespace mantissa::models {

HfLayout llama_hf_layout(const LlamaConfig& c) {
  using Rule = HfConfigField::Rule;
  HfLayout layout;
  layout.family = "Llama";
  layout.architecture = "LlamaForCausalLM";
  const int64_t C = c.n_embd, D = c.head_dim(), I = c.ffn_hidden;
  const int64_t q_rows = c.n_head * D, kv_rows = c.n_kv_head * D;
  auto rows = [&](const std::string& hf, const std::string& ours, int64_t begin, int64_t count,
                  int64_t cols) {
    layout.tensors.push_back({hf, ours, begin, count, cols, false});
  };

  // The token embedding without the padding rows.
  rows("model.embed_tokens.weight", "embed_tokens.weight", 0, c.vocab_size, C);
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string ours = "layers." + std::to_string(i) + ".";
    const std::string hf = "model." + ours;
    rows(hf + "input_layernorm.weight", ours + "input_layernorm.weight", 0, C, 0);
    const std::string qkv = ours + "self_attn.qkv_proj.weight";
    rows(hf + "self_attn.q_proj.weight", qkv, 0, q_rows, C);
    rows(hf + "self_attn.k_proj.weight", qkv, q_rows, kv_rows, C);
    rows(hf + "self_attn.v_proj.weight", qkv, q_rows + kv_rows, kv_rows, C);
    rows(hf + "self_attn.o_proj.weight", ours + "self_attn.o_proj.weight", 0, C, q_rows);
    rows(hf + "post_attention_layernorm.weight", ours + "post_attention_layernorm.weight", 0, C, 0);
    const std::string gate_up = ours + "mlp.gate_up_proj.weight";
    rows(hf + "mlp.gate_proj.weight", gate_up, 0, I, C);
    rows(hf + "mlp.up_proj.weight", gate_up, I, I, C);
    rows(hf + "mlp.down_proj.weight", ours + "mlp.down_proj.weight", 0, C, I);
    // The RoPE frequency buffer that older checkpoints carry.
    layout.ignored.push_back(hf + "self_attn.rotary_emb.inv_freq");
  }
  rows("model.norm.weight", "norm.weight", 0, C, 0);
  if (c.tie_embeddings) {
    layout.tied_copy = "lm_head.weight";
    layout.tied_to = "model.embed_tokens.weight";
  } else {
    rows("lm_head.weight", "lm_head.weight", 0, c.vocab_size, C);
  }

  // Fallbacks are LlamaConfig's defaults (transformers' configuration_llama.py); those of
  // num_key_value_heads and head_dim are derived from the other fields, as there, also when
  // config.json gives them as null.
  layout.config = {
      {"architectures", "[\"LlamaForCausalLM\"]", Rule::kWritten, "", "null"},
      {"model_type", core::json_quoted("llama"), Rule::kEqual, "", ""},
      {"vocab_size", hf_json(c.vocab_size), Rule::kEqual, "model.llama.vocab_size", "32000"},
      {"hidden_size", hf_json(C), Rule::kEqual, "model.llama.n_embd", "4096"},
      {"intermediate_size", hf_json(I), Rule::kEqual, "model.llama.ffn_hidden", "11008"},
      {"num_hidden_layers", hf_json(c.n_layer), Rule::kEqual, "model.llama.n_layer", "32"},
      {"num_attention_heads", hf_json(c.n_head), Rule::kEqual, "model.llama.n_head", "32"},
      {"num_key_value_heads", hf_json(c.n_kv_head), Rule::kEqual, "model.llama.n_kv_head",
       hf_json(c.n_head), "", true},
      {"head_dim", hf_json(D), Rule::kEqual, "model.llama.n_embd / model.llama.n_head", hf_json(D),
       "", true},
      {"max_position_embeddings", hf_json(c.seq_len), Rule::kAtLeast, "model.llama.seq_len",
       "2048"},
      {"rms_norm_eps", hf_json(c.norm_eps), Rule::kEqual, "model.llama.norm_eps", "1e-06"},
      {"rope_theta", hf_json(c.rope_theta), Rule::kEqual, "model.llama.rope_theta", "10000.0"},
      {"rope_scaling", "null", Rule::kEqual, "", "null"},
      {"hidden_act", core::json_quoted("silu"), Rule::kEqual, "", "\"silu\""},
      {"attention_bias", "false", Rule::kEqual, "", "false"},
      {"mlp_bias", "false", Rule::kEqual, "", "false"},
      {"tie_word_embeddings", c.tie_embeddings ? "true" : "false", Rule::kEqual,
       "model.llama.tie_embeddings", "false"},
      {"torch_dtype", core::json_quoted("float32"), Rule::kWritten, "", "null"},
  };
  return layout;
}

}  // namespace mantissa::models
