// `mantissa export`: the FP32 weights of a run's newest intact checkpoint, for tools outside
// mantissa, in one of two formats:
//  - kSafetensors: one safetensors file with mantissa's own parameter names and shapes
//    (checkpoint/safetensors.h: matrices stored [out, in]; GPT-2's wte holds the true
//    vocabulary, [vocab_size, C], without the model's padding rows), the step and the effective
//    config in its metadata;
//  - kHf: a Hugging Face model directory (launcher/hf_weights.h: model.safetensors under
//    transformers' names and layouts, config.json, the run's tokenizer.model), which
//    transformers loads as GPT2LMHeadModel or LlamaForCausalLM and model.init_from reads.
// Runs as one process without MPI, on the CPU.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

#include "config.pb.h"

namespace mantissa::launcher {

enum class ExportFormat { kSafetensors, kHf };

// Loads the masters of the newest intact checkpoint in <run.dir>/checkpoints into the model
// the config describes and writes them to `out` (a file, or a directory for kHf); returns the
// checkpoint's directory. Throws core::ConfigError when there is no checkpoint at all, when the
// model has no Hugging Face layout (the MLP) or `out` is a non-empty directory (kHf);
// core::Error when none is intact or the output cannot be written.
std::string export_checkpoint_weights(const TrainConfig& config, const std::string& out,
                                      ExportFormat format = ExportFormat::kSafetensors);

// The SentencePiece model of a run, which a Hugging Face export copies: data.tokenizer, else
// tokenizer.model beside the token shards when there is one; none for bytes.
std::optional<std::string> run_tokenizer_file(const TrainConfig& config);

// Whether token shards that have no tokenizer are bytes: a vocabulary of at most 256 ids, each
// a byte's value (sample decodes them so; an export needs no tokenizer for them).
bool shard_ids_are_bytes(const TrainConfig& config);

// Where the tokenizer of the token shards `pattern` matches is: tokenizer.model beside them
// (mantissa tokenize encode writes the tokenizer that encoded them there).
std::filesystem::path shards_tokenizer_path(const std::string& pattern);

// shards_tokenizer_path, when the data are shards and it is there.
std::optional<std::string> shards_tokenizer_file(const TrainConfig& config);

// The directory a token shard pattern's files are in: the pattern's own, with glob(3)'s
// backslash escapes removed ("shards \[v2]/train_*.bin" is in "shards [v2]"); "." for none.
std::filesystem::path shards_directory(const std::string& pattern);

// Throws core::ConfigError when data.tokenizer names a file that is not there, saying where
// `command` ("mantissa sample") is to run when the path is relative (run_relative_hint).
void require_named_tokenizer(const TrainConfig& config, const std::string& command);

// " (a path relative to the directory mantissa train ran in: run `command` from there)" when
// `path` is relative, else "": a run's config names its files from the directory it ran in, so
// a command run elsewhere does not find them.
std::string run_relative_hint(const std::filesystem::path& path, const std::string& command);

}  // namespace mantissa::launcher
