#include "launcher/model_config.h"

#include "launcher/config/config_translate.h"
#include "models/mlp/mlp.h"

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

std::unique_ptr<train::LanguageModel> build_model(const TrainConfig& config, core::Backend& backend,
                                                  const core::PrecisionPolicy& policy,
                                                  train::MasterShard shard) {
  const uint64_t seed = config.run().seed();
  if (config.model().has_mlp()) {
    const TrainConfig::Model::MLP& m = config.model().mlp();
    return std::make_unique<models::MLP>(
        models::MLPConfig{m.n_embd(), m.hidden(), m.seq_len(), m.vocab_size()}, backend, policy,
        seed, fp8_scaling_config(config), shard);
  }
  if (config.model().has_llama()) {
    return std::make_unique<models::Llama>(llama_config(config.model().llama()), backend, policy,
                                           seed, fp8_scaling_config(config), shard);
  }
  return std::make_unique<models::GPT2>(gpt2_config(config.model().gpt2()), backend, policy, seed,
                                        fp8_scaling_config(config), shard);
}

}  // namespace mantissa::launcher
