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
#pragma once

#include <string>
#include <string_view>

#include "config.pb.h"
#include "core/error.h"
#include "core/optim/adamw.h"
#include "core/optim/lr_schedule.h"
#include "core/precision/fp8_scaling.h"
#include "core/precision/loss_scaler.h"
#include "core/precision/policy.h"
#include "dist/data_parallel.h"

namespace mantissa::launcher {

// Parses protobuf text format. Unknown fields, bad enum names and syntax errors are reported
// as "<source>:<line>:<column>: <what>" (1-based).
TrainConfig parse_config_text(std::string_view text, const std::string& source);
TrainConfig load_config_file(const std::string& path);

// Applies "path.to.field=value". The path walks nested messages by field name; the value is
// parsed for the field's type: numbers (range-checked for the field's width), enum names,
// true/false, strings as written, and for a message field its text-format body
// (`--set 'data.synthetic={}'`, `--set 'model.mlp={n_embd: 32}'`). A repeated field gets the
// value appended. Setting a member of a oneof selects it.
void apply_override(TrainConfig& config, std::string_view assignment);

// Sets every field that is still unset to its default (the table in config.cpp; also shown by
// `mantissa train --help`). A missing model or data source becomes gpt2 {} or synthetic {}.
// run.dir defaults to runs/<config file name without extension>.
void apply_defaults(TrainConfig& config, const std::string& config_path);

// Checks every field of a config with defaults applied: value ranges, cross-field rules (heads
// divide the width, warmup within the run, vocabulary covers the data) and that the data files
// exist. Checks that need the world or the device are the Trainer's.
void validate(const TrainConfig& config);

// "path = value" lines of the default table, for --help.
std::string describe_defaults();

// The config in protobuf text format (every set field; after apply_defaults, all of them).
std::string to_text(const TrainConfig& config);

// Throws core::ConfigError("<path> = <value>: <rule>") unless `ok`; also used by the Trainer for
// the checks that depend on the world size or the device.
void require(bool ok, std::string_view path, std::string_view value, std::string_view rule);
std::string format_number(double value);

// The config translated for the parts that run it.
core::PrecisionPolicy precision_policy(const TrainConfig& config);
core::LossScalerConfig loss_scaler_config(const TrainConfig& config);
core::Fp8ScalingConfig fp8_scaling_config(const TrainConfig& config);
core::AdamWConfig adamw_config(const TrainConfig& config);
core::LrScheduleConfig lr_schedule_config(const TrainConfig& config);
dist::DistConfig dist_config(const TrainConfig& config);

}  // namespace mantissa::launcher
