#include "launcher/model_config.h"

namespace mantissa::launcher {

models::GPT2Config gpt2_config(const TrainConfig::Model::GPT2& g) {
  return models::GPT2Config{g.n_layer(), g.n_head(), g.n_embd(), g.seq_len(), g.vocab_size()};
}

models::LlamaConfig llama_config(const TrainConfig::Model::Llama& l) {
  models::LlamaConfig c;
  c.n_layer = l.n_layer();
  c.n_head = l.n_head();
  c.n_kv_head = l.n_kv_head();
  c.n_embd = l.n_embd();
  c.ffn_hidden = l.ffn_hidden();
  c.seq_len = l.seq_len();
  c.vocab_size = l.vocab_size();
  c.rope_theta = l.rope_theta();
  c.norm_eps = static_cast<float>(l.norm_eps());
  c.tie_embeddings = l.tie_embeddings();
  return c;
}

}  // namespace mantissa::launcher
