// The training configuration: reading it, overriding it from the command line, filling in its
// defaults and checking it, before anything is built from it.
//
//   TrainConfig c = load_config_file(path);        // text format; "FILE:LINE:COL: why"
//   for (auto& s : sets) apply_override(c, s);     // "--set run.steps=10"
//   apply_defaults(c, path);                       // every unset field gets its default
//   validate(c);                                   // "optimizer.adamw.beta1 = 1: must ..."
//
// Every failure throws core::ConfigError with one line that names the file position, the --set
// argument or the field, the offending value and what is allowed; the launcher prints it and
// exits with kExitConfig.
//
// One idea per source file: config_parse.cpp (text format, --set), config_fields.cpp (the
// reflection both use), config_defaults.cpp (the default table), config_validate.cpp, and
// config_translate.h (the config as the modules' options).
#pragma once

#include <optional>
#include <string>
#include <string_view>

#include "config.pb.h"
#include "core/config_check.h"
#include "core/error.h"
#include "launcher/config/config_translate.h"

namespace mantissa::launcher {

// Parses protobuf text format. Unknown fields, bad enum names and syntax errors are reported
// as "<source>:<line>:<column>: <what>" (1-based).
TrainConfig parse_config_text(std::string_view text, const std::string& source);
TrainConfig load_config_file(const std::string& path);

// Applies "path.to.field=value". The path walks nested messages by field name; the value is
// parsed for the field's type: numbers (range-checked for the field's width), enum names,
// true/false, strings as written, and for a message field its text-format body
// (`--set 'data.synthetic={}'`, `--set 'model.mlp={n_embd: 32}'`). A repeated field gets the
// value appended. Setting a member of a oneof selects it. Returns a note when the assignment
// selected a oneof member through one of its fields and so dropped the member selected before
// (`model.gpt2.n_layer=2` on a Llama config), else nothing: the caller shows it, so that a
// mistyped path does not silently replace the model or the data source.
struct OverrideNote {
  std::string selected;  // the member selected, "model.gpt2"
  std::string text;      // "--set ... selects model.gpt2 in place of model.llama, whose ..."
};
std::optional<OverrideNote> apply_override(TrainConfig& config, std::string_view assignment);

// Sets every field that is still unset to its default (the table in config_defaults.cpp; also
// shown by `mantissa train --help`). A missing model or data source becomes gpt2 {} or
// synthetic {}. run.dir defaults to runs/<config file name without extension>.
void apply_defaults(TrainConfig& config, const std::string& config_path);

// Whether the data section holds out a validation set: data.synthetic.val_tokens > 0,
// data.text_file.val_fraction > 0, or a data.token_shards.val_pattern (defaults applied).
bool has_validation_data(const TrainConfig::Data& data);

// Checks every field of a config with defaults applied: value ranges (those of the modules'
// options by the modules' own validate()), cross-field rules (heads divide the width, warmup
// within the run, vocabulary covers the data), that the data files exist and the CPU backend's
// environment switches. Checks that need the world are validate_for_world's, those that need
// the device the Trainer's.
// DataFiles::kSkip leaves out the checks that the data files exist (for commands that never
// read them: `mantissa plan` projects the run of a config written for another machine).
enum class DataFiles { kCheck, kSkip };
void validate(const TrainConfig& config, DataFiles files = DataFiles::kCheck);

// model.init_from names weights the model can start from: an llm.c GPT-2 file, or a Hugging
// Face directory with its files, readable. Apart from validate(): only a start that resumes
// nothing reads them, and a run's checkpoints outlive them.
void check_initial_weights(const TrainConfig::Model& model);

// The checks that need the job's shape: the rank debug.inject_nonfinite_rank names exists, and
// each rank's metrics port (metrics.port + its local rank) is a port. Every rank runs them
// before the ranks compare their verdicts, so that one rank's refusal ends every rank alike.
void validate_for_world(const TrainConfig& config, int world_size, int local_rank);

// The environment switches of the CPU backend, the attention layer and MPI's progress thread
// (MANTISSA_CPU_*, MANTISSA_FLASH_ATTENTION, MANTISSA_MPI_PROGRESS_THREAD): a bad value throws
// core::ConfigError "environment: <VARIABLE>=<value>: ...". validate() runs it; commands that
// take no config (`mantissa sample`) call it themselves.
void validate_environment();

// "path = value" lines of the default table, for --help.
std::string describe_defaults();

// The config in protobuf text format (every set field; after apply_defaults, all of them).
std::string to_text(const TrainConfig& config);

// The value of the field at `path` ("run.dir") for a program to read, with a newline: a string
// as its bytes (no escapes), a number, enum or bool as text format writes it, a message as its
// text-format body; a repeated field one value per line. Throws core::ConfigError naming the
// path when it names no field or runs through a oneof member the config does not select.
std::string config_value(const TrainConfig& config, std::string_view path);

// require(ok, path, value, rule) throws core::ConfigError("<path> = <value>: <rule>") unless
// `ok`; also used by the Trainer for the checks that depend on the world size or the device.
// format_number(x) is the shortest text that reads back as x.
using core::format_number;
using core::require;

}  // namespace mantissa::launcher
