// Llama as Hugging Face's LlamaForCausalLM (models/hf_layout.h says what a table is).
//
// Names: model.embed_tokens.weight, model.layers.<i>.{input_layernorm, self_attn.{q,k,v,o}_proj,
// post_attention_layernorm, mlp.{gate,up,down}_proj}.weight, model.norm.weight, lm_head.weight
// (absent when the embeddings are tied), all [out, in] as ours. Our fused projections are split
// by rows: qkv_proj [(n_head + 2 n_kv_head) D, C] into q_proj (the first n_head D rows), k_proj
// and v_proj (n_kv_head D rows each); gate_up_proj [2I, C] into gate_proj and up_proj (I each).
// No RoPE permutation: our RoPE pairs channel j with j + D/2 of each head (rotate_half), as
// transformers' does, so q_proj's and k_proj's rows are ours unpermuted (Meta's original
// checkpoints pair adjacent channels; their conversion to this layout permutes, we need not).
// The vocabulary keeps vocab_size rows (our padding rows are dropped, and stay zero on import).
// config.json: model_type "llama", hidden_size, intermediate_size, num_hidden_layers,
// num_attention_heads, num_key_value_heads, head_dim, rms_norm_eps, rope_theta,
// max_position_embeddings (= seq_len; an import accepts a longer one, which no tensor
// depends on), vocab_size, tie_word_embeddings, and the fixed parts of our math: hidden_act
// "silu", no rope_scaling, no attention or MLP biases.
#pragma once

#include "models/hf_layout.h"
#include "models/llama/llama.h"

namespace mantissa::models {

HfLayout llama_hf_layout(const LlamaConfig& config);

}  // namespace mantissa::models
