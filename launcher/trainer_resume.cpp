// The Trainer's resume: a checkpoint loaded into this rank's part of the state, and what it
// says about the run it came from (another tokenizer refused, other settings reported, scaling
// state restored as far as this run's settings take it).
#include <algorithm>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/strings.h"
#include "launcher/build_info.h"
#include "launcher/config/config.h"
#include "launcher/config/config_diff.h"
#include "launcher/trainer.h"
#include "train/fp8_operands.h"

namespace mantissa::launcher {
namespace {

// Where a run's training tokens come from, as a message names it.
std::string data_source(const TrainConfig::Data& data) {
  if (data.has_text_file()) return "the text file " + data.text_file().path();
  if (data.has_token_shards()) return "the token shards " + data.token_shards().pattern();
  return "synthetic tokens";
}

// Whether this run trains on the checkpoint's tokens. The tokens decide, not the configured
// path: data moved to another directory is the same data. Checkpoints from before the
// fingerprint was recorded compare the paths.
bool same_training_tokens(const checkpoint::CheckpointState& state, const TrainConfig& config,
                          uint64_t fingerprint) {
  if (state.data_fingerprint != 0) return state.data_fingerprint == fingerprint;
  const std::optional<TrainConfig> recorded = recorded_config(state.config_text);
  return !recorded || data_source(recorded->data()) == data_source(config.data());
}

bool is_sampling(const UnrecordedSetting& s) {
  return s.path == "data.sampling";
}

// How the checkpoint's run drew its windows: its data.sampling, or RANDOM for a build before
// data.sampling, which drew them as RANDOM does.
TrainConfig::Data::Sampling sampling_drawn(const checkpoint::CheckpointState& state,
                                           const TrainConfig& config) {
  const std::vector<UnrecordedSetting> unrecorded = unrecorded_settings(state.config_text, config);
  if (std::any_of(unrecorded.begin(), unrecorded.end(), is_sampling)) {
    return TrainConfig::Data::RANDOM;
  }
  const std::optional<TrainConfig> recorded = recorded_config(state.config_text);
  return recorded ? recorded->data().sampling() : config.data().sampling();
}

// Whether the windows a resume reads, or their order, are other than the checkpoint's: other
// tokens, another seq_len (a Llama's), another run.seed (which keys the shuffle) or another
// data.sampling. Then the rest of the checkpoint's epoch would skip some windows and read
// others twice.
bool window_order_changed(const checkpoint::CheckpointState& state, const TrainConfig& config,
                          uint64_t fingerprint) {
  if (!same_training_tokens(state, config, fingerprint) || state.seed != config.run().seed() ||
      sampling_drawn(state, config) != config.data().sampling()) {
    return true;
  }
  const std::optional<TrainConfig> recorded = recorded_config(state.config_text);
  return recorded && model_shape(recorded->model()).seq_len != model_shape(config.model()).seq_len;
}

}  // namespace

bool Trainer::restore() {
  const dist::World::Activity resuming(world_, "looking for a checkpoint to resume from");
  const TrainConfig::Checkpoint& c = config_.checkpoint();
  if (c.resume() == TrainConfig::Checkpoint::NEVER) {
    // A fresh start would save over the old run's steps and then drop its newer ones: refused,
    // so that nothing saved is lost to a setting. The ranks decide together: one whose listing
    // is stale must not start while the others stop.
    const std::vector<int64_t> saved = checkpointer_->agreed_steps();
    if (saved.empty()) return false;
    throw core::ConfigError("checkpoint.resume = NEVER: " + checkpointer_->options().dir +
                            " holds checkpoints (the newest of step " +
                            std::to_string(saved.front()) +
                            ") that starting afresh would replace: choose another run.dir, or "
                            "move them away");
  }

  // This rank's part of masters and moments, whatever the world size at save time.
  train::ParameterStore& params = model_->parameters();
  const std::vector<checkpoint::BufferSlice> slices = checkpoint_slices();
  metrics_->record_checkpoint_start();  // a long load is no stall either
  const std::optional<checkpoint::CheckpointState> state = [&] {
    try {
      return checkpointer_->load_latest(checkpoint::parameter_layout(params), slices);
    } catch (const checkpoint::CheckpointMisfit& e) {
      throw core::ConfigError(e.what() +
                              misfit_explanation(e.config_text(), config_,
                                                 "resume with the model config it was trained "
                                                 "with, or start in another run.dir"));
    }
  }();
  metrics_->record_checkpoint_loaded();
  if (!state) {
    require(c.resume() != TrainConfig::Checkpoint::REQUIRED, "checkpoint.resume", "REQUIRED",
            "there is no checkpoint: " + checkpointer_->options().dir + " " +
                checkpoint::no_checkpoint_reason(checkpointer_->options().dir));
    return false;
  }
  // Only a Llama's context may change on resume: its seq_len (no weight depends on it) and the
  // RoPE base that long-context training raises with it. Every rank alike: all read the same
  // checkpoint.
  require_recorded_model(state->config_text, state->step, checkpointer_->options().dir, config_,
                         {"model.llama.seq_len", "model.llama.rope_theta"},
                         "its weights would compute something else; resume with the model config "
                         "it was trained with, or start in another run.dir");
  require_same_tokenizer(*state);
  if (config_.dist().zero_stage() == 0 && world_.size() > 1) {
    // Each rank read its 1/N of the replica; the other parts come from the ranks that read
    // them, over the interconnect rather than the file system.
    const int64_t n = params.flat_numel();
    std::vector<int64_t> counts;
    for (int r = 0; r < world_.size(); ++r)
      counts.push_back(checkpoint::replica_part(n, r, world_.size()).count);
    std::vector<StateBuffer> buffers = state_buffers();
    for (size_t b = 0; b < buffers.size(); ++b) {
      dp_->communicator().all_gather(slices[b].data, buffers[b].tensor, counts)->wait();
    }
  }

  optimizer_->refresh_compute_copy(params);
  optimizer_->set_steps_taken(state->optimizer_steps);
  restore_scaling(*state);
  loader_->set_cursor(state->data);
  if (window_order_changed(*state, config_, train_data_.fingerprint)) {
    // A whole epoch of the new windows from here, not the rest of one begun before.
    loader_->start_epochs_here();
    say("mantissa: the training data's epochs count from step " + std::to_string(state->step) +
        ": its tokens, its windows' length or their order (run.seed, data.sampling) differ "
        "from the checkpoint's");
  }
  start_step_ = state->step;
  tokens_total_ = state->tokens;
  last_saved_step_ = state->step;
  resumed_saved_unix_time_ = state->saved_unix_time;
  if (!evaluator_) validation_key_ = state->validation_key;
  if (state->last_val_loss) {
    if (state->validation_key == 0 || state->validation_key == validation_key_) {
      metrics_->record_resumed_val_loss({*state->last_val_loss, state->val_loss_rises});
    } else {
      say("mantissa: the validation loss is measured on other tokens than the checkpoint's "
          "(the validation data, run.eval_tokens or the window length changed): "
          "mantissa_val_loss_rises counts from this run's first evaluation");
    }
  }
  report_changes(*state);
  // After a redeploy the build changes mid-run: the line says so, for whoever compares the
  // steps before and after.
  const bool other_build = !state->written_by.empty() && state->written_by != build_name();
  say("mantissa: resumed from " + checkpointer_->options().dir + "/" +
      checkpoint::checkpoint_dir_name(state->step) + " (saved by " +
      std::to_string(state->world_size) + " rank" + (state->world_size == 1 ? "" : "s") +
      (other_build ? " running " + state->written_by : "") + ")");
  return true;
}

void Trainer::restore_scaling(const checkpoint::CheckpointState& state) {
  scaler_->set_state(state.loss_scaler);
  if (scaler_->config().mode == core::LossScaleMode::kDynamic) {
    const float saved = state.loss_scaler.scale;
    if (!state.loss_scaler.dynamic) {
      say("mantissa: the checkpoint's loss scale " + core::format_number(saved) +
          " was a fixed one: the dynamic loss scale starts at precision.loss_scale.init = " +
          core::format_number(scaler_->scale()));
    } else if (scaler_->scale() != saved) {
      say("mantissa: the checkpoint's loss scale " + core::format_number(saved) +
          " lies outside precision.loss_scale [min, max]: it goes on from " +
          core::format_number(scaler_->scale()));
    }
  }
  if (train::Fp8Operands* fp8 = model_->fp8_operands()) {
    // A run that switches to FP8 on resume starts its scales afresh; one that switches FP8
    // recipe only when told to (the scaling states of two recipes do not carry over).
    if (!state.fp8.tensors.empty()) {
      const core::Fp8Recipe recipe = fp8->config().recipe;
      const std::string now = core::fp8_recipe_name(recipe);
      // Checkpoints older than the recorded recipe had a per-tensor one, which the config they
      // recorded names (DELAYED and CURRENT keep different state too).
      std::string saved = state.fp8.recipe;
      if (saved.empty()) {
        if (const std::optional<TrainConfig> recorded = recorded_config(state.config_text)) {
          saved = TrainConfig::Precision::Fp8::Recipe_Name(recorded->precision().fp8().recipe());
        }
      }
      const bool changed = saved.empty() ? core::is_block_recipe(recipe) : saved != now;
      // The same recipe with another precision.fp8.grad_format: the gradients' scales (fitted
      // to one format's range) do not carry over either.
      const std::optional<std::string> reformatted =
          changed ? std::nullopt : fp8->registry().format_change(state.fp8);
      const bool allowed = config_.precision().fp8().allow_recipe_change();
      const std::string afresh =
          "set precision.fp8.allow_recipe_change=true to resume with fresh FP8 scaling state";
      if (changed) {
        require(allowed, "precision.fp8.recipe", now,
                "differs from the recipe of the checkpoint to resume (" +
                    (saved.empty() ? std::string("DELAYED or CURRENT") : saved) + "); " + afresh);
        say("mantissa: FP8 recipe " + now + " replaces the checkpoint's " +
            (saved.empty() ? std::string("per-tensor recipe") : saved) +
            ": FP8 scaling state starts afresh");
      } else if (reformatted) {
        const std::string format =
            TrainConfig::Precision::Fp8::Format_Name(config_.precision().fp8().grad_format());
        require(allowed, "precision.fp8.grad_format", format,
                "differs from the format of the checkpoint to resume (" + *reformatted + "); " +
                    afresh);
        say("mantissa: FP8 gradient format " + format + " replaces the checkpoint's (" +
            *reformatted + "): FP8 scaling state starts afresh");
      } else {
        fp8->registry().set_state(state.fp8);
        fp8->upload_scales(*backend_);
      }
    }
  }
}

void Trainer::require_same_tokenizer(const checkpoint::CheckpointState& state) {
  if (state.tokenizer_crc32c == 0 || state.tokenizer_crc32c == tokenizer_crc32c_) return;
  // Almost always a mistake (shards re-encoded by another tokenizer, or its file gone, after
  // which no later resume could tell either): refused, alike on every rank (rank 0 says it),
  // unless allowed.
  const TrainConfig::Data& data = config_.data();
  const bool allowed = data.allow_tokenizer_change();
  const std::string shards =
      "data.token_shards.pattern = \"" + data.token_shards().pattern() + "\"";
  if (tokenizer_crc32c_ != 0) {
    const std::string refused = data.tokenizer().empty()
                                    ? shards + ": its tokenizer " + tokenizer_file_
                                    : "data.tokenizer = \"" + data.tokenizer() + "\":";
    if (!allowed) {
      throw RanksDisagree(refused +
                          " is another than the one the checkpoint was trained with, so the "
                          "same token ids would stand for other text; set "
                          "data.allow_tokenizer_change=true to train on with it");
    }
    say("mantissa: warning: the checkpoint was trained with another tokenizer than " +
        tokenizer_file_ +
        ": the same token ids stand for other text from here on (data.allow_tokenizer_change)");
    return;
  }
  // Shards whose tokenizer.model is gone may be the same tokens; other data without a
  // tokenizer (synthetic tokens, a text file's bytes) are not the checkpoint's ids at all.
  const std::string missing =
      data.has_token_shards()
          ? shards + ": no " + std::string(train::kShardsTokenizerFile) + " beside the shards"
          : "data: " + data_source(data) + (data.has_synthetic() ? " have" : " has") +
                " no tokenizer";
  if (!allowed) {
    throw RanksDisagree(
        missing + ", but the checkpoint was trained with one, so " +
        (data.has_token_shards()
             ? "nothing shows that the token ids still stand for the same text; put it back, or "
               "set data.allow_tokenizer_change=true to train on without it"
             : "its token ids stand for other text; set data.allow_tokenizer_change=true to "
               "train on with them"));
  }
  say("mantissa: warning: " + missing +
      ": the tokenizer the checkpoint was trained with is not compared, and later resumes "
      "cannot compare it either (data.allow_tokenizer_change)");
}

void Trainer::report_changes(const checkpoint::CheckpointState& state) {
  // Another corpus on resume is allowed (a second phase of training), but not silently.
  const std::optional<TrainConfig> recorded = recorded_config(state.config_text);
  const std::string trained_on = recorded ? data_source(recorded->data()) : "";
  const std::string reads = data_source(config_.data());
  const bool same_tokens = same_training_tokens(state, config_, train_data_.fingerprint);
  const bool seed_changed = state.seed != config_.run().seed();
  // Synthetic tokens are generated from the seed: the seed's warning below says it all.
  const bool regenerated = seed_changed && config_.data().has_synthetic() && trained_on == reads;
  if (!same_tokens && !regenerated) {
    const bool same_path = trained_on.empty() || trained_on == reads;
    say("mantissa: warning: the checkpoint was trained on " +
        (same_path ? std::string("other data") : trained_on) + ", this run reads " + reads +
        ": the data stream changes from here on");
  } else if (!trained_on.empty() && trained_on != reads) {
    say("mantissa: the checkpoint was trained on " + trained_on + ", this run reads " + reads +
        ": the same tokens, so the data stream continues");
  } else if (state.data_fingerprint == 0 && !config_.data().has_synthetic()) {
    say("mantissa: note: the checkpoint predates the record of its training tokens (an earlier "
        "build saved it): data changed under the same path would not be noticed");
  }
  if (seed_changed) {
    say("mantissa: warning: the checkpoint was trained with run.seed " +
        std::to_string(state.seed) + ", this run has " + std::to_string(config_.run().seed()) +
        ": the data stream changes from here on");
  }
  const std::vector<UnrecordedSetting> unrecorded = unrecorded_settings(state.config_text, config_);
  using Data = TrainConfig::Data;
  const bool sampling_unrecorded = std::any_of(unrecorded.begin(), unrecorded.end(), is_sampling);
  const Data::Sampling drew = sampling_drawn(state, config_);
  if (drew != config_.data().sampling()) {
    say("mantissa: warning: the checkpoint's run drew its windows with data.sampling " +
        Data::Sampling_Name(drew) + ", this run reads " +
        Data::Sampling_Name(config_.data().sampling()) + ": the data stream changes from here on" +
        (sampling_unrecorded ? " (the earlier build that wrote the checkpoint drew them as RANDOM "
                               "does: --set data.sampling=RANDOM continues its stream)"
                             : ""));
  }
  std::vector<UnrecordedSetting> noted = unrecorded;
  std::erase_if(noted, is_sampling);  // said above
  if (!noted.empty()) {
    say("mantissa: note: an earlier build wrote the checkpoint, without these settings; this run "
        "takes them as " +
        core::join(noted, ", ",
                   [](const UnrecordedSetting& s) { return s.path + " = " + s.value; }) +
        " (that build may have behaved otherwise: --set one to keep the run as it was)");
  }
  std::vector<std::string> changed =
      recorded ? config_differences(*recorded, config_) : std::vector<std::string>{};
  // Their checkpoint side would be this build's default, which the checkpoint never held.
  std::erase_if(changed, [&](const std::string& change) {
    return std::any_of(unrecorded.begin(), unrecorded.end(), [&](const UnrecordedSetting& s) {
      return change.starts_with(s.path + " ");
    });
  });
  // Settings a resumed run has no use for: saying so spares a user the guess.
  const core::LossScaleMode scaling = scaler_->config().mode;
  const bool scale_goes_on = scaling == core::LossScaleMode::kDynamic && state.loss_scaler.dynamic;
  for (std::string& change : changed) {
    if (change.starts_with("model.init_from ")) {
      change += " (no effect: it only starts a run)";
    } else if (change.starts_with("precision.loss_scale.init ")) {
      if (scale_goes_on) change += " (no effect: the dynamic scale goes on from the checkpoint's)";
      if (scaling == core::LossScaleMode::kNone) change += " (no effect: loss_scale.mode is NONE)";
    }
  }
  // One change on the line itself, more one to a line.
  if (changed.size() == 1) {
    say("mantissa: settings changed since the checkpoint: " + changed.front());
  } else if (!changed.empty()) {
    say("mantissa: settings changed since the checkpoint (checkpoint -> this run):\n  " +
        core::join(changed, "\n  "));
  }
  // The schedule spans run.steps: a longer run (or other optimizer settings) moves the rate the
  // next step takes, which the list above does not show.
  if (recorded) {
    const double was = core::LrSchedule(lr_schedule_config(*recorded)).at(state.step);
    const double is = schedule_->at(state.step);
    if (was != is) {
      const auto rate = [](double lr) {
        std::ostringstream text;
        text << std::setprecision(3) << lr;
        return text.str();
      };
      say("mantissa: note: the learning rate of step " + std::to_string(state.step + 1) + " is " +
          rate(is) + " under this config's schedule (" + rate(was) + " under the checkpoint's)");
    }
  }
  // On another number of ranks, the same micro-batches make another global batch; the
  // settings above are per rank, so no difference lists it.
  if (recorded && state.world_size != world_.size()) {
    const auto global_batch = [](const TrainConfig::Data& d, int64_t ranks) {
      return d.micro_batch_size() * d.grad_accum_steps() * ranks;
    };
    const int64_t was = global_batch(recorded->data(), state.world_size);
    const int64_t is = global_batch(config_.data(), world_.size());
    if (was != is) {
      say("mantissa: note: the global batch changes from " + std::to_string(was) + " to " +
          std::to_string(is) +
          " sequences per step (data.micro_batch_size x data.grad_accum_steps x ranks); "
          "data.grad_accum_steps or data.micro_batch_size can keep it");
    }
  }
}

}  // namespace mantissa::launcher
