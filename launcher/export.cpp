#include "launcher/export.h"

#include <cstdio>
#include <filesystem>
#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/durable_file.h"
#include "core/missing_directories.h"
#include "core/ops/backend.h"
#include "launcher/config/config.h"
#include "launcher/config/config_diff.h"
#include "launcher/config/config_translate.h"
#include "launcher/hf_weights.h"
#include "launcher/model_config.h"
#include "launcher/run_dir.h"
#include "launcher/tokenize/tokenize_client.h"
#include "train/data/corpus.h"

namespace mantissa::launcher {
namespace {

// The model is the one the checkpoint trained: --format hf writes heads, the RoPE base and the
// norm epsilon into config.json. Except a Llama's seq_len, which changes no weight and only
// config.json's max_position_embeddings: a longer context is the user's call.
void require_model_of(const checkpoint::CheckpointState& state, const TrainConfig& config,
                      const std::string& dir) {
  require_recorded_model(state.config_text, state.step, dir, config, {"model.llama.seq_len"},
                         "export the model it trained, with the checkpoint's values");
}

// The tokenizer a Hugging Face export copies (run_tokenizer_file). Throws core::ConfigError
// when the config names one that is not there. Warns that `out` gets none, for a vocabulary
// wider than bytes, when the token shards have none beside them (llm.c's GPT-2 shards), or
// when their directory is not there (the data need not be: a run copied elsewhere, or a
// relative path from another directory).
std::optional<std::string> tokenizer_to_export(const TrainConfig& config, const std::string& out) {
  const TrainConfig::Data& data = config.data();
  require_named_tokenizer(config, "mantissa export");
  const std::optional<std::string> found = run_tokenizer_file(config);
  if (found || !data.has_token_shards() || shard_ids_are_bytes(config)) {
    return found;
  }
  const std::filesystem::path shards = shards_directory(data.token_shards().pattern());
  std::error_code ec;
  const std::string why = std::filesystem::is_directory(shards, ec)
                              ? "there is no " + std::string(train::kShardsTokenizerFile) + " in " +
                                    shards.string() + " beside the shards"
                              : "the shards' directory " + shards.string() + " is not there" +
                                    run_relative_hint(shards, "mantissa export");
  std::fprintf(stderr,
               "mantissa: warning: no tokenizer for this run (data.tokenizer is empty and %s): "
               "%s gets none; name the one the shards were encoded with by --set "
               "data.tokenizer=PATH (for llm.c's GPT-2 shards, transformers' gpt2 tokenizer)\n",
               why.c_str(), out.c_str());
  return std::nullopt;
}

// The nearest directory above the directory `out` that exists, where its temporary sibling
// (and any parents it needs) will be made.
std::string nearest_existing_above(const std::string& out) {
  std::filesystem::path dir = std::filesystem::path(out).lexically_normal();
  if (!dir.has_filename()) dir = dir.parent_path();
  const std::filesystem::path above = dir.has_parent_path() ? dir.parent_path() : ".";
  const std::vector<std::filesystem::path> missing = core::missing_directories(above);
  return (missing.empty() ? above : missing.back().parent_path()).string();
}

}  // namespace

void require_named_tokenizer(const TrainConfig& config, const std::string& command) {
  const std::string& tokenizer = config.data().tokenizer();
  std::error_code ec;
  require(tokenizer.empty() || std::filesystem::is_regular_file(tokenizer, ec), "data.tokenizer",
          "\"" + tokenizer + "\"",
          "no such file, named by the run's config" + run_relative_hint(tokenizer, command));
}

std::string run_relative_hint(const std::filesystem::path& path, const std::string& command) {
  return path.is_relative() ? " (a path relative to the directory mantissa train ran in: run " +
                                  command + " from there)"
                            : "";
}

std::filesystem::path shards_directory(const std::string& pattern) {
  std::string unescaped;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) ++i;  // "\c" matches c itself
    unescaped += pattern[i];
  }
  const std::filesystem::path dir = std::filesystem::path(unescaped).parent_path();
  return dir.empty() ? "." : dir;
}

std::optional<std::string> run_tokenizer_file(const TrainConfig& config) {
  if (!config.data().tokenizer().empty()) return config.data().tokenizer();
  return shards_tokenizer_file(config);
}

bool shard_ids_are_bytes(const TrainConfig& config) {
  return model_shape(config.model()).vocab_size <= 256;
}

std::filesystem::path shards_tokenizer_path(const std::string& pattern) {
  return shards_directory(pattern) / train::kShardsTokenizerFile;
}

std::optional<std::string> shards_tokenizer_file(const TrainConfig& config) {
  const TrainConfig::Data& data = config.data();
  if (!data.has_token_shards()) return std::nullopt;
  const std::filesystem::path beside = shards_tokenizer_path(data.token_shards().pattern());
  std::error_code ec;
  if (std::filesystem::is_regular_file(beside, ec)) return beside.string();
  return std::nullopt;
}

std::string export_checkpoint_weights(const TrainConfig& config, const std::string& out,
                                      ExportFormat format) {
  std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
  // The masters are FP32 whatever the run's precision, and the parameter layout does not
  // depend on it: an FP32 model holds them without FP8 scaling state it would not use.
  const std::unique_ptr<train::LanguageModel> model =
      build_model(config, *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32));
  train::ParameterStore& params = model->parameters();
  // Before the checkpoint is read: a model without a Hugging Face layout is a config error.
  std::optional<models::HfLayout> layout;
  if (format == ExportFormat::kHf) layout = hf_layout_of(*model, "--format hf");
  const std::optional<std::string> tokenizer =
      layout ? tokenizer_to_export(config, out) : std::nullopt;
  std::error_code ec;
  // The directory is made beside its name and renamed into place, which a link there (to an
  // empty directory, or dangling) refuses only at the end, after the whole export.
  std::string out_name = out;  // without a trailing '/', through which lstat would follow a link
  while (out_name.size() > 1 && out_name.back() == '/') out_name.pop_back();
  if (layout && std::filesystem::is_symlink(std::filesystem::symlink_status(out_name, ec))) {
    throw core::ConfigError("--out " + out +
                            ": is a symbolic link; give the directory it names, or another --out");
  }
  if (!layout && !std::filesystem::path(out).has_filename()) {
    throw core::ConfigError("--out " + out +
                            ": names a directory (it ends in '/'); a safetensors file is "
                            "written, --format hf writes a directory");
  }
  if (!layout && std::filesystem::is_directory(out, ec)) {
    throw core::ConfigError("--out " + out +
                            ": is a directory (a safetensors file is written; --format hf writes "
                            "a directory)");
  }
  // A safetensors file needs its directory; --format hf creates its directories.
  const std::filesystem::path parent = std::filesystem::path(out).parent_path();
  if (!layout && !parent.empty() && !std::filesystem::is_directory(parent, ec)) {
    throw core::ConfigError(
        "--out " + out + ": directory '" + parent.string() +
        (std::filesystem::exists(parent, ec) ? "' is not a directory" : "' does not exist"));
  }
  if (!layout && std::filesystem::exists(std::filesystem::symlink_status(out, ec))) {
    throw core::ConfigError("--out " + out +
                            ": already exists; remove it first, or choose another --out");
  }
  // Before the weights are read (minutes for a large model): where the export's first new entry
  // goes, the file's directory or the nearest existing one above a Hugging Face directory.
  core::require_can_create_files("--out '" + out + "'", layout ? nearest_existing_above(out)
                                                        : parent.empty() ? "."
                                                                         : parent.string());

  const std::string dir = run_checkpoints_dir(config.run().dir());
  checkpoint::Checkpointer checkpointer(checkpoint::CheckpointOptions{dir, 0},
                                        checkpoint::CheckpointGroup{}, *backend);
  // Before reading gigabytes of weights: the newest manifest says which model they are.
  if (const std::optional<checkpoint::CheckpointState> newest = checkpointer.newest_manifest()) {
    require_model_of(*newest, config, dir);
  }
  const std::optional<checkpoint::CheckpointState> state = [&] {
    try {
      return checkpointer.load_latest(checkpoint::parameter_layout(params),
                                      {checkpoint::whole_masters(params)});
    } catch (const checkpoint::CheckpointMisfit& e) {
      throw core::ConfigError(
          e.what() + misfit_explanation(e.config_text(), config,
                                        "export with the model config it was trained with"));
    }
  }();
  require(
      state.has_value(), "run.dir", "\"" + config.run().dir() + "\"",
      "holds no checkpoint to export (" + dir + " " + checkpoint::no_checkpoint_reason(dir) + ")");
  require_model_of(*state, config, dir);
  const std::string step = std::to_string(state->step);
  if (layout) {
    if (tokenizer) {
      // transformers' generate() stops at eos_token_id, and without these keys it takes
      // GPT2Config's 50256 or LlamaConfig's 1 and 2, ids of other vocabularies. The run's end of
      // text begins every document it trained on (llm.c's format), so it is both.
      const std::string eot = std::to_string(TokenizerClient(*tokenizer).eot());
      for (const char* key : {"bos_token_id", "eos_token_id"})
        layout->config.push_back({key, eot, models::HfConfigField::Rule::kWritten, "", "null"});
    }
    export_hf_directory(out, *layout, params, *backend, tokenizer, {{"mantissa_step", step}});
  } else {
    // GPT-2 pads its vocabulary internally (models/gpt2/gpt2.h); the file keeps the true one.
    std::map<std::string, int64_t> leading_rows;
    if (!config.model().has_mlp() && !config.model().has_llama())
      leading_rows["wte"] = config.model().gpt2().vocab_size();
    if (config.model().has_llama()) {
      const int64_t vocab = config.model().llama().vocab_size();
      leading_rows["embed_tokens.weight"] = vocab;
      if (!config.model().llama().tie_embeddings()) leading_rows["lm_head.weight"] = vocab;
    }
    core::remove_orphaned_temporaries_of(out);  // an earlier export's, killed while writing
    // Checked free above, before the weights were read: never replaced if filled since.
    checkpoint::export_safetensors(
        out, params, *backend, {{"mantissa_step", step}, {"mantissa_config", state->config_text}},
        leading_rows, core::AtPath::kKeep);
  }
  return dir + "/" + checkpoint::checkpoint_dir_name(state->step);
}

}  // namespace mantissa::launcher
