#include "launcher/export.h"

#include <map>

#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "core/ops/backend.h"
#include "launcher/config.h"
#include "launcher/trainer.h"

namespace mantissa::launcher {

std::string export_checkpoint_weights(const TrainConfig& config, const std::string& out) {
  std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
  // The masters are FP32 whatever the run's precision, and the parameter layout does not
  // depend on it: an FP32 model holds them without FP8 scaling state it would not use.
  const std::unique_ptr<train::LanguageModel> model =
      build_model(config, *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32));
  train::ParameterStore& params = model->parameters();

  const std::string dir = config.run().dir() + "/checkpoints";
  checkpoint::Checkpointer checkpointer(checkpoint::CheckpointOptions{dir, 0},
                                        checkpoint::CheckpointGroup{}, *backend);
  const std::optional<checkpoint::CheckpointState> state =
      checkpointer.load_latest(checkpoint::parameter_layout(params),
                               {{"masters", params.flat_numel(), 0, params.masters()}});
  require(state.has_value(), "run.dir", "\"" + config.run().dir() + "\"",
          "holds no checkpoint to export (" + dir + " is empty or missing)");
  // GPT-2 pads its vocabulary internally (models/gpt2/gpt2.h); the file keeps the true one.
  std::map<std::string, int64_t> leading_rows;
  if (!config.model().has_mlp()) leading_rows["wte"] = config.model().gpt2().vocab_size();
  checkpoint::export_safetensors(
      out, params, *backend,
      {{"mantissa_step", std::to_string(state->step)}, {"mantissa_config", state->config_text}},
      leading_rows);
  return dir + "/" + checkpoint::checkpoint_dir_name(state->step);
}

}  // namespace mantissa::launcher
