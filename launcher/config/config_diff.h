// What a resumed run changed against the config its checkpoint was trained with, for what the
// Trainer prints on resume ("settings changed since the checkpoint: optimizer.adamw.lr 0.003 ->
// 0.001", one change to a line when there are more): changing settings on resume is allowed (a
// longer run, a lower learning rate), but the run's own record should say so.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "config.pb.h"

namespace mantissa::launcher {

// "path before -> after" for every scalar or repeated field whose value differs, in field
// order. Both configs are effective ones (every default filled in). A oneof member present in
// one config only (another model or data source) is one entry, "model.arch gpt2 -> llama".
std::vector<std::string> config_differences(const TrainConfig& before, const TrainConfig& after);

// The differences in the model's architecture alone: config_differences under `model.`, less
// model.init_from (which only starts a run). What a checkpoint's weights mean depends on them,
// also where no tensor shape does (heads, RoPE base, norm epsilon).
std::vector<std::string> model_differences(const TrainConfig& before, const TrainConfig& after);

// Throws core::ConfigError when the model config a checkpoint recorded (`config_text`, of step
// `step` in `dir`) differs from `config`'s in any field but those `may_change` (paths such as
// "model.llama.seq_len"): "checkpoint step <step> in <dir> was trained with another model
// config (checkpoint -> this config: <differences>): <advice>". Weights that fit the model's
// shapes may still mean something else (other heads, another norm epsilon). Nothing when the
// text no longer parses.
void require_recorded_model(const std::string& config_text, int64_t step, const std::string& dir,
                            const TrainConfig& config,
                            std::initializer_list<std::string_view> may_change,
                            const std::string& advice);

// What follows a checkpoint::CheckpointMisfit's message (a checkpoint whose parameters do not
// fit the model), from the config text it recorded: "; its model config differs:
// model.gpt2.n_layer 2 -> 3 (<advice>)"; where the recorded model config is this run's, that
// another build laid the parameters out otherwise (no config fixes that); " (<advice>)" where
// the text does not parse.
std::string misfit_explanation(const std::string& checkpoint_config_text, const TrainConfig& config,
                               const std::string& advice);

// The config a checkpoint recorded (CheckpointState::config_text); nothing when that text no
// longer parses (a checkpoint from an older version), which leaves nothing to compare.
// Defaults fill the fields the text lacks, so these compare as this build's defaults.
std::optional<TrainConfig> recorded_config(const std::string& config_text);

// A setting a checkpoint's recorded config lacks, and its value in this run's config.
struct UnrecordedSetting {
  std::string path;   // "data.text_file.val_fraction"
  std::string value;  // "0.1"
};

// The settings a checkpoint's recorded config lacks. A checkpoint records the effective config,
// every field set, so these are settings added after the build that wrote it, which may have
// behaved otherwise (before val_fraction, a text file trained whole): compared with anything,
// the checkpoint's side would only be this build's default. Empty when the text no longer
// parses.
std::vector<UnrecordedSetting> unrecorded_settings(const std::string& config_text,
                                                   const TrainConfig& config);

}  // namespace mantissa::launcher
