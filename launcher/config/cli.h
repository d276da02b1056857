// The command line of `mantissa train`, `config` and `export`:
//   --config FILE.pbtxt  [--set path.to.field=value]...  [--progress auto|live|lines]  (train)
//   --out FILE.safetensors | --out DIR --format hf  [--format safetensors|hf]  (export: --out
//   is required; --run DIR in place of --config: DIR/config.pbtxt with run.dir=DIR)
// Both `--opt value` and `--opt=value` are accepted.
#pragma once

#include <string>
#include <vector>

#include "launcher/config/config.h"
#include "metrics/run_log.h"

namespace mantissa::launcher {

struct TrainArgs {
  bool help = false;
  std::string config_path;
  std::vector<std::string> sets;  // in command-line order: later ones win
  metrics::ProgressMode progress = metrics::ProgressMode::kAuto;
  std::string get;         // config only: the field whose value alone is printed
  std::string out;         // export only
  std::string run_dir;     // export --run only: DIR, which stands for --config DIR/config.pbtxt
  bool hf_format = false;  // export --format hf (else safetensors)
};

// `command` (train, config or export) decides which options exist and is named in the hint
// that ends each message. Throws core::ConfigError for a malformed command line.
TrainArgs parse_train_args(const std::string& command, const std::vector<std::string>& args);

// The effective config: the file, then every --set in order, then the defaults, validated
// (the data files' existence too, unless `files` is kSkip: export reads only checkpoints).
// apply_override's notes (a --set that replaced the model or the data source) go to `notes`.
TrainConfig effective_config(const TrainArgs& args, std::vector<OverrideNote>& notes,
                             DataFiles files = DataFiles::kCheck);

// effective_config, with its notes (what the --set arguments replaced) on stderr from rank 0.
// When the config is refused for a field no --set named, the notes about the members whose
// values the refusal cites join the error's line: a --set that switched a oneof member leaves
// the new member's other fields at their defaults, and the note says why (`--set
// data.text_file.val_fraction=0.5`: "data.text_file.path = "": must name a file"; `--set
// model.llama.n_layer=1`: "run.eval_tokens = 64: must be >= model.llama.seq_len = 256").
TrainConfig effective_config_noted(const TrainArgs& parsed, int rank,
                                   DataFiles files = DataFiles::kCheck);

}  // namespace mantissa::launcher
