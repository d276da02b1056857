// How a model's parameters map onto a Hugging Face `transformers` checkpoint: the tensor names
// and layouts of its model.safetensors and the fields of its config.json. Each family writes
// its table once (models/gpt2/hf_layout.h, models/llama/hf_layout.h); `mantissa export
// --format hf` and model.init_from both read it (launcher/hf_weights.h), so the way out and
// the way back in cannot drift apart.
//
// A table row says which rows of which parameter a Hugging Face tensor is, and whether it is
// stored transposed:
//   hf = param[row_begin : row_begin + rows, :]            (transpose false)
//   hf = param[row_begin : row_begin + rows, :]^T          (transpose true: GPT-2's Conv1D)
// Slices of rows split a fused parameter (Llama's q|k|v and gate|up projections) and drop
// padding (the vocabulary rows past vocab_size, which are zero and stay zero). Rows that no
// tensor covers must be such padding: an import leaves them zero.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mantissa::models {

struct HfTensor {
  std::string name;       // Hugging Face's, e.g. "model.layers.0.self_attn.q_proj.weight"
  std::string parameter;  // the ParameterStore's, e.g. "layers.0.self_attn.qkv_proj.weight"
  int64_t row_begin = 0;  // first row of the parameter taken
  int64_t rows = 0;       // rows taken
  int64_t cols = 0;       // the parameter's row length; 0 for a vector
  bool transpose = false;

  // The Hugging Face shape: {rows}, {rows, cols}, or {cols, rows} when transposed.
  std::vector<int64_t> shape() const;
  int64_t numel() const { return rows * (cols ? cols : 1); }
};

// One field of config.json. `value` and `fallback` are JSON text (12, 1e-05, "silu", true,
// null, ["LlamaForCausalLM"]).
struct HfConfigField {
  enum class Rule {
    kEqual,    // an import requires this value
    kAtLeast,  // an import accepts this value or a larger number (a longer trained context)
    kWritten,  // written for transformers, not checked on import (architectures, n_ctx)
  };
  std::string key;
  std::string value;
  Rule rule = Rule::kEqual;
  // The run config field it comes from ("model.gpt2.n_embd"), or empty when it is a constant
  // of mantissa's architecture (activation_function "gelu_new").
  std::string source;
  // What transformers assumes when config.json lacks the key; empty: the key is required.
  std::string fallback;
  // Another value an import takes as this one: what `value` stands for, written out (GPT-2's
  // n_inner: null is 4 n_embd, and a config may say 3072); empty: none.
  std::string also{};
  // A null in config.json means `fallback` too: transformers derives the value when it is None
  // (Llama's num_key_value_heads and head_dim). Elsewhere it keeps None, which can mean
  // something else (GPT-2's scale_attn_weights: null does not scale), so null is compared.
  bool null_is_fallback = false;
};

struct HfLayout {
  std::string family;        // "GPT-2", "Llama": names the model in messages
  std::string architecture;  // "GPT2LMHeadModel", "LlamaForCausalLM"
  std::vector<HfTensor> tensors;
  std::vector<HfConfigField> config;
  // Tensors an import skips: non-parameter buffers that older checkpoints carry (GPT-2's
  // causal masks h.<i>.attn.bias, Llama's rotary inv_freq). Exact names.
  std::vector<std::string> ignored;
  // Tied embeddings: the output projection some files still carry ("lm_head.weight", as the
  // file names it) beside the token embedding it is a copy of (`tied_to`, as `tensors` names
  // it). An import skips it when it holds the same bytes and refuses it otherwise. Empty:
  // untied, where lm_head.weight is a tensor of its own.
  std::string tied_copy, tied_to;
  // A prefix of every tensor name that files may also leave out: the Hub's GPT-2 checkpoints
  // name "h.0.ln_1.weight" what GPT2LMHeadModel.state_dict() calls
  // "transformer.h.0.ln_1.weight" (transformers loads either). Empty: none.
  std::string optional_prefix;
};

// Copies tensor t out of its parameter's FP32 values (row-major, the whole parameter) into
// `hf` (t.numel() values in Hugging Face's layout).
void to_hf(const HfTensor& t, const float* parameter, float* hf);

// The inverse: writes `hf` into t's rows of the parameter's values; other rows are untouched.
void from_hf(const HfTensor& t, const float* hf, float* parameter);

// JSON text of numbers, for the tables (strings: core::json_quoted).
std::string hf_json(int64_t value);
std::string hf_json(float value);   // shortest text that reads back as the same float
std::string hf_json(double value);  // shortest text that reads back as the same double

}  // namespace mantissa::models
