// The model section of a TrainConfig as the models' own configs (defaults applied), for
// everything that builds a model (build_model) or reasons about one (`mantissa plan`).
#pragma once

#include <memory>

#include "config.pb.h"
#include "core/ops/backend.h"
#include "core/precision/policy.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "train/language_model.h"

namespace mantissa::launcher {

models::GPT2Config gpt2_config(const TrainConfig::Model::GPT2& g);
models::LlamaConfig llama_config(const TrainConfig::Model::Llama& l);

// The model the config describes, its masters initialised from run.seed (the same on every
// rank), on `backend`; only the masters of `shard` are kept (a ZeRO-1 rank's).
std::unique_ptr<train::LanguageModel> build_model(const TrainConfig& config, core::Backend& backend,
                                                  const core::PrecisionPolicy& policy,
                                                  train::MasterShard shard = {});

}  // namespace mantissa::launcher
