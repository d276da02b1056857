// Hugging Face model directories: what `mantissa export --format hf` writes and what
// model.init_from reads besides llm.c files. A directory holds
//   model.safetensors   the weights, FP32, under transformers' names and layouts
//   config.json         the architecture's fields, as transformers' config classes read them
//   tokenizer.model     the run's SentencePiece model, when it has one (export only)
// The names, layouts and config fields of each family are one table (models/hf_layout.h):
// GPT-2 as GPT2LMHeadModel (models/gpt2/hf_layout.h), Llama as LlamaForCausalLM
// (models/llama/hf_layout.h).
#pragma once

#include <map>
#include <optional>
#include <string>

#include "core/ops/backend.h"
#include "models/hf_layout.h"
#include "train/language_model.h"

namespace mantissa::launcher {

inline constexpr const char* kHfWeightsFile = "model.safetensors";
inline constexpr const char* kHfWeightsIndexFile = "model.safetensors.index.json";  // shards
inline constexpr const char* kHfConfigFile = "config.json";
inline constexpr const char* kHfTokenizerFile = "tokenizer.model";

// The table of a GPT-2 or Llama model; throws core::ConfigError for a model without one (the
// MLP), naming `field` (the config field that asked: "model.init_from", "--format").
models::HfLayout hf_layout_of(train::LanguageModel& model, const std::string& field);

// The text of config.json for `layout`: every field with its value, one per line.
std::string hf_config_json(const models::HfLayout& layout);

// Writes the model directory `dir` from the FP32 masters of `params` (the store must hold all
// of them) and, when given, a copy of the tokenizer file. Everything is written into
// `dir`.tmp, fsynced and renamed to `dir`, so that `dir` never exists half-written. Throws
// core::ConfigError when `dir` exists and is not an empty directory, or when `dir`.tmp
// exists holding files of its own (a stale `dir`.tmp of ours, from a crashed export, is
// replaced); core::Error for I/O failures. `metadata` goes into model.safetensors beside
// transformers' {"format": "pt"}.
void export_hf_directory(const std::string& dir, const models::HfLayout& layout,
                         const train::ParameterStore& params, core::Backend& backend,
                         const std::optional<std::string>& tokenizer,
                         const std::map<std::string, std::string>& metadata = {});

// Whether `path` is meant as a model directory (a directory), rather than an llm.c file.
bool is_hf_directory(const std::string& path);

// Overwrites the masters `params` keeps (all, or a ZeRO-1 shard) and the whole compute copy
// with the weights of the model directory `dir`. config.json must agree with the layout (each
// field equal, or as transformers defaults it when absent; max_position_embeddings may be
// larger than seq_len); model.safetensors, or the shards model.safetensors.index.json names,
// must hold exactly the layout's tensors between them (the
// "transformer." prefix of GPT-2's names optional, known buffers such as GPT-2's attn.bias
// skipped), each with its shape, in F32, BF16 or F16. Rows no tensor covers (vocabulary
// padding) become zero. Throws core::Error naming the directory and the field or tensor at
// fault; `params` is untouched unless everything was read.
void import_hf_directory(const std::string& dir, const models::HfLayout& layout,
                         train::ParameterStore& params, core::Backend& backend);

}  // namespace mantissa::launcher
