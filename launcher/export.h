// `mantissa export`: the FP32 weights of a run's newest intact checkpoint as a safetensors
// file (checkpoint/safetensors.h: GPT-2 parameter names, matrices stored [out, in]; wte holds
// the true vocabulary, [vocab_size, C], without the model's padding rows), for tools outside
// mantissa. Runs as one process without MPI, on the CPU.
#pragma once

#include <string>

#include "config.pb.h"

namespace mantissa::launcher {

// Loads the masters of the newest intact checkpoint in <run.dir>/checkpoints into the model
// the config describes and writes them to `out`; returns the checkpoint's directory. Throws
// core::ConfigError when there is no checkpoint at all, core::Error when none is intact or the
// file cannot be written.
std::string export_checkpoint_weights(const TrainConfig& config, const std::string& out);

}  // namespace mantissa::launcher
