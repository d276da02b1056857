// The Llama that the Hugging Face layout and weight tests share: L=2, C=16, 4 query heads of
// D=4 sharing 2 key/value heads, I=24, vocabulary 10, Llama 3's rope_theta; small enough that
// every tensor's rows can be checked one by one, with grouped-query attention and both head
// ties.
#pragma once

#include "models/llama/llama.h"

namespace mantissa::models::testing {

inline LlamaConfig tiny_hf_llama(bool tied_embeddings) {
  LlamaConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 16;
  c.ffn_hidden = 24;
  c.seq_len = 8;
  c.vocab_size = 10;
  c.rope_theta = 500000.0;
  c.norm_eps = 1e-6f;
  c.tie_embeddings = tied_embeddings;
  return c;
}

}  // namespace mantissa::models::testing
