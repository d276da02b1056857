// GPT-2 as Hugging Face's GPT2LMHeadModel (models/hf_layout.h says what a table is).
//
// Names: "transformer." + wte.weight, wpe.weight, h.<i>.{ln_1, attn.c_attn, attn.c_proj, ln_2,
// mlp.c_fc, mlp.c_proj}.{weight, bias}, ln_f.{weight, bias}: the keys of
// GPT2LMHeadModel.state_dict(), which its save_pretrained writes and its from_pretrained loads
// without renaming. The Hub's own gpt2 files leave the "transformer." prefix out (they were
// saved from the base model); transformers adds it when loading, and so does our import
// (optional_prefix). The LM head is tied to wte, so lm_head.weight is not written (as
// save_pretrained leaves out tied weights).
// Layouts: transformers' Conv1D computes x @ W + b with W stored [in, out], the transpose of our
// Linear's [out, in]: the four matrices of each block are transposed. c_attn's output columns
// are q | k | v, each head's channels contiguous, as our rows are. wte keeps vocab_size rows
// (our padding rows are dropped, and stay zero on import).
// config.json: model_type "gpt2", n_embd, n_layer, n_head, n_positions (= seq_len, the rows of
// wpe), vocab_size, and the fixed parts of our math: layer_norm_epsilon 1e-5, activation
// "gelu_new" (GELU's tanh form), tied embeddings, attention scaled by 1/sqrt(head dim) only.
#pragma once

#include "models/gpt2/gpt2.h"
#include "models/hf_layout.h"

namespace mantissa::models {

HfLayout gpt2_hf_layout(const GPT2Config& config);

}  // namespace mantissa::models
