// The model section of a TrainConfig as the models' own configs (defaults applied), for
// everything that builds a model (build_model) or reasons about one (`mantissa plan`).
#pragma once

#include "config.pb.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"

namespace mantissa::launcher {

models::GPT2Config gpt2_config(const TrainConfig::Model::GPT2& g);
models::LlamaConfig llama_config(const TrainConfig::Model::Llama& l);

}  // namespace mantissa::launcher
