// What a resumed run changed against the config its checkpoint was trained with, for the line
// the Trainer prints on resume ("settings changed since the checkpoint: optimizer.adamw.lr
// 0.003 -> 0.001, ..."): changing settings on resume is allowed (a longer run, a lower
// learning rate), but the run's own record should say so.
#pragma once

#include <string>
#include <vector>

#include "config.pb.h"

namespace mantissa::launcher {

// "path before -> after" for every scalar or repeated field whose value differs, in field
// order. Both configs are effective ones (every default filled in). A oneof member present in
// one config only (another model or data source) is one entry, "model.arch gpt2 -> llama".
std::vector<std::string> config_differences(const TrainConfig& before, const TrainConfig& after);

}  // namespace mantissa::launcher
