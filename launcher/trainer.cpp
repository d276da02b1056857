#include "launcher/trainer.h"

#include <omp.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iomanip>
#include <sstream>
#include <utility>

#include "checkpoint/checkpoint_manifest.h"
#include "checkpoint/crc32c.h"
#include "core/device_peaks.h"
#include "core/dtype/dtype.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/missing_directories.h"
#include "core/ops/cpu_switches.h"
#include "core/precision/block_scaling.h"
#include "core/precision/fp8_scaling.h"
#include "core/read_file.h"
#include "core/strings.h"
#include "launcher/build_info.h"
#include "launcher/checkpoints_writable.h"
#include "launcher/config/config.h"
#include "launcher/config/config_diff.h"
#include "launcher/cpu_threads.h"
#include "launcher/exit_codes.h"
#include "launcher/export.h"
#include "launcher/hf_weights.h"
#include "launcher/model_config.h"
#include "launcher/run_dir.h"
#include "launcher/signals.h"
#include "launcher/tokenize/tokenize_client.h"
#include "models/gpt2/llmc_import.h"
#include "train/data/corpus.h"
#include "train/fault_injection.h"
#include "train/fp8_operands.h"

namespace mantissa::launcher {

namespace {

using Clock = std::chrono::steady_clock;

// "12/300": how people see step numbers (the progress line counts from 1).
std::string step_of(int64_t number, int64_t total) {
  return std::to_string(number) + "/" + std::to_string(total);
}

std::string stop_cause(const AgreedStop& stop) {
  const std::string signal = stop.signal == StopRequest::kInterrupt ? "interrupted (SIGINT)"
                             : stop.signal == StopRequest::kStop
                                 ? "stop requested (SIGUSR1/SIGTERM/SIGHUP)"
                                 : "";
  if (!stop.log_unwritable) return signal;
  return "a rank's step log could not be written (above)" +
         (signal.empty() ? "" : ", and " + signal);
}

int stop_exit_code(const AgreedStop& stop) {
  if (stop.log_unwritable) return kExitFailure;
  return stop.signal == StopRequest::kInterrupt ? kExitInterrupted : kExitOk;
}

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// How often rank 0 says how far a long evaluation has come.
constexpr double kEvaluationNoteSeconds = 30.0;

const char* model_name(const TrainConfig::Model& model) {
  if (model.has_mlp()) return "MLP";
  if (model.has_llama()) return "Llama";
  return "GPT-2";
}

// The CRC32C of a file's bytes (the run's tokenizer model, as a checkpoint records it).
uint32_t file_crc32c(const std::string& path) {
  const std::string bytes = core::read_whole_file(path, "tokenizer");
  return checkpoint::crc32c(bytes.data(), bytes.size());
}

}  // namespace

Trainer::Trainer(dist::World& world, const TrainConfig& config, metrics::ProgressMode progress)
    : world_(world),
      config_(config),
      run_dir_(config.run().dir()),
      run_dir_cleanup_(run_dir_, world.rank() == 0),
      progress_(progress, config.run().steps(), config.run().log_every(), stderr,
                {config.run().eval_every(), config.checkpoint().every_steps()}) {
  // Rank 0 makes run.dir and locks it; the other ranks use it once they have read a file rank
  // 0 wrote there (require_shared_run_dir below). So a start they refuse leaves no directory
  // behind (rank 0's cleanup removes the one it made), and no rank makes one of its own on a
  // disk that is not shared.
  if (world.rank() == 0) {
    std::error_code ec;
    std::filesystem::create_directories(run_dir_, ec);
    if (ec) {
      // Missing here is a parent that cannot hold directories (/proc): only the config can fix
      // it.
      core::throw_error_of_kind(core::named_path_error_kind(ec.value()),
                                "run.dir = \"" + run_dir_ + "\": cannot be created: " +
                                    core::create_directories_failure(run_dir_, ec));
    }
    run_dir_lock_.emplace(run_dir_);
    run_dir_cleanup_.locked();
    require_checkpoints_writable(run_dir_, config_.run().steps(), world.size());
  }

  cpus_in_use_ = set_cpu_threads(world);
  device_ = select_device(config_, world.local_rank());
  backend_ = make_backend(device_);
  policy_ = precision_policy(config_);
  check_fp8_recipe_support();
  // The exporter opens before the long part of a start (data, the ranks' agreement, the model,
  // the communicators, a checkpoint to load), so that a slow start is scraped, not seen down.
  const std::string mfu_peak_note = build_metrics();
  build_data();
  // Before the model (two ranks on one GPU might not both fit) and the communicators: a job
  // whose ranks do not share what they must (launcher/rank_agreement.h) stops here, every rank
  // with the same message.
  require_ranks_agree(world, rank_start(), config_.dist().timeout_s());
  require_shared_run_dir(world, run_dir_, config_.dist().timeout_s());
  // The job owns run.dir now (a second job on it stops above, its pushes never replacing this
  // one's groups): a Pushgateway learns at once that an attempt has started.
  metrics_->record_started();
  // Under ZeRO-1 the model keeps only this rank's shard of the masters from the start.
  const train::MasterShard shard = config_.dist().zero_stage() == 1
                                       ? train::MasterShard{world.rank(), world.size()}
                                       : train::MasterShard{};
  model_ = build_model(config_, *backend_, policy_, shard);
  metrics_->set_model_flops(model_->flops_per_token());

  dp_ = dist::DataParallel::create(world, *backend_, model_->parameters(), dist_config(config_));
  optimizer_ = dp_->make_optimizer(adamw_config(config_));
  scaler_ = std::make_unique<core::LossScaler>(loss_scaler_config(config_));
  schedule_ = std::make_unique<core::LrSchedule>(lr_schedule_config(config_));
  step_ = std::make_unique<train::TrainingStep>(
      *model_, *backend_, policy_, *scaler_, *optimizer_, *schedule_,
      static_cast<float>(config_.optimizer().grad_clip()));
  const TrainConfig::Debug& debug = config_.debug();
  step_->before_check = train::nonfinite_injector(
      *backend_, world.rank(), debug.inject_nonfinite_rank(),
      {debug.inject_nonfinite_steps().begin(), debug.inject_nonfinite_steps().end()});

  checkpoint::CheckpointGroup group{world.rank(), world.size(),
                                    [this](double value) { return dp_->sum_across_ranks(value); }};
  checkpointer_ = std::make_unique<checkpoint::Checkpointer>(
      checkpoint::CheckpointOptions{run_checkpoints_dir(run_dir_), config_.checkpoint().keep()},
      std::move(group), *backend_);
  const bool resumed = restore();
  if (!resumed) {
    if (!config_.model().init_from().empty()) import_initial_weights();
    dp_->broadcast_parameters();
  }

  // Until this run saves, the newest checkpoint is the one it resumed from: the dashboard's
  // checkpoint panels show it rather than nothing after every requeue.
  if (resumed) metrics_->record_resumed_checkpoint(start_step_, resumed_saved_unix_time_);
  metrics_->record_first_step(start_step_);
  // Rank 0 lists log/ for the logs of an earlier attempt on more ranks; the others are told.
  std::string listed;
  if (world.rank() == 0) {
    listed = core::join(metrics::logged_ranks_beyond(run_dir_, world.size()), " ",
                        [](int r) { return std::to_string(r); });
  }
  std::vector<int> ranks_beyond;
  std::istringstream told(world.all_gather(listed, config_.dist().timeout_s())[0]);
  for (int r = 0; told >> r;) ranks_beyond.push_back(r);
  if (world.rank() == 0) metrics_->forget_ranks(ranks_beyond);
  log_ = std::make_unique<metrics::StepLog>(run_dir_, world.rank(), world.size(), start_step_,
                                            ranks_beyond);
  // The config the steps in run.dir were trained with: a start with nothing left to train
  // (run.steps at or below the checkpoint's step) leaves the last one's.
  if (world.rank() == 0) {
    core::remove_temporaries_of(run_config_file(run_dir_));  // an earlier start's, killed
    if (start_step_ < config_.run().steps()) {
      core::write_file_atomically(run_config_file(run_dir_), to_text(config_));
    }
  }

  const ModelShape dims = model_shape(config_.model());
  const int64_t global_batch =
      config_.data().micro_batch_size() * config_.data().grad_accum_steps() * world.size();
  char summary[512];
  std::snprintf(
      summary, sizeof summary,
      "mantissa: %s, %.2fM parameters, %s | %d rank%s on %s | batch %lld x %lld tokens "
      "per step | %s",
      model_name(config_.model()), static_cast<double>(model_->parameter_count()) / 1e6,
      core::precision_mode_name(policy_.mode), world.size(), world.size() == 1 ? "" : "s",
      device_.name.c_str(), static_cast<long long>(global_batch),
      static_cast<long long>(dims.seq_len),
      resumed ? ("resumed at step " + std::to_string(start_step_)).c_str() : "starting at step 0");
  say(summary);
  // The validation set, or the groups of windows a forward pass takes, decide what each
  // evaluation reads where it is not run.eval_tokens' whole windows: said, not silently.
  const int64_t eval_windows = std::max<int64_t>(1, config_.run().eval_tokens() / dims.seq_len);
  if (evaluator_ && evaluator_->tokens() != eval_windows * dims.seq_len) {
    const std::string asked = "mantissa: note: run.eval_tokens is " +
                              std::to_string(config_.run().eval_tokens()) + ", and ";
    const std::string groups =
        evaluator_->group_windows() == 1
            ? ""
            : " in whole groups of " + std::to_string(evaluator_->group_windows()) +
                  " windows (this model's forward passes take a multiple of " +
                  std::to_string(evaluator_->token_multiple()) + " tokens)";
    if (evaluator_->available_tokens() < eval_windows * dims.seq_len) {
      say(asked + "the validation set holds " + std::to_string(evaluator_->available_tokens()) +
          " tokens in whole windows of seq_len + 1: each evaluation reads " +
          std::to_string(evaluator_->tokens()) + " of them" + groups);
    } else {
      say(asked + "each evaluation reads " + std::to_string(evaluator_->tokens()) + " tokens" +
          groups);
    }
  }
  // A training file too short for one window is never read: said, not silently dropped.
  if (const std::vector<std::string> unread = loader_->unread_segments(); !unread.empty()) {
    std::string names;
    for (size_t i = 0; i < unread.size() && i < 5; ++i) names += (i ? ", " : "") + unread[i];
    if (unread.size() > 5) names += ", and " + std::to_string(unread.size() - 5) + " more";
    say("mantissa: note: " + std::to_string(unread.size()) +
        " training file(s) hold fewer than seq_len + 1 = " + std::to_string(dims.seq_len + 1) +
        " tokens, and no window reads them: " + names);
  }
  // A corpus smaller than one step's batch is allowed (a test of the set-up, a tiny text), but
  // every step then reads the same tokens again: said, as a newcomer may not expect it.
  if (loader_->windows_per_epoch() < global_batch) {
    say("mantissa: note: the training data hold " + std::to_string(loader_->windows_per_epoch()) +
        " window(s) of " + std::to_string(dims.seq_len) + " tokens (" +
        std::to_string(train_data_.tokens) + " tokens), fewer than one step reads (" +
        std::to_string(global_batch) + "): every step reads the same tokens again");
  }
  // A text's end held out for an evaluation that never runs is read by nothing: said, as a
  // user who turned evaluation off may expect the whole text to be trained.
  const TrainConfig::Data& data = config_.data();
  if (data.has_text_file() && data.text_file().val_fraction() > 0.0 &&
      config_.run().eval_every() == 0) {
    say("mantissa: note: data.text_file.val_fraction = " +
        core::format_number(data.text_file().val_fraction()) +
        " holds the text's end out for evaluation, and run.eval_every = 0 runs none: no step "
        "reads those tokens (val_fraction=0 trains on them)");
  }
  // Allowed (a user's choice), but never FP16's default: a config written out by an earlier
  // BF16 run (run.dir/config.pbtxt lists loss_scale.mode NONE) and resumed in FP16 gets it.
  if (config_.precision().mode() == TrainConfig::Precision::FP16 &&
      config_.precision().loss_scale().mode() == TrainConfig::Precision::LossScale::NONE) {
    say("mantissa: warning: precision.mode FP16 with precision.loss_scale.mode NONE: gradients "
        "smaller than about 6e-8 (FP16's smallest subnormal) are lost and above 65504 "
        "overflow; DYNAMIC, FP16's default, scales them into its range");
  }
  const TrainConfig::Optimizer& optimizer = config_.optimizer();
  if (optimizer.warmup_steps() > config_.run().steps()) {
    say("mantissa: note: optimizer.warmup_steps " + std::to_string(optimizer.warmup_steps()) +
        " is longer than run.steps " + std::to_string(config_.run().steps()) +
        ": the learning rate ramps for the whole run and never reaches optimizer.adamw.lr");
  }
  // On the CPU, which code paths ran decides the figures (and, for BF16 operands, the last
  // bits): say so, so that runs on different machines can be compared.
  if (!device_.cuda) say("mantissa: " + core::cpu_paths_description());
  say(mfu_peak_note);
  const TrainConfig::Metrics& metrics = config_.metrics();
  if (metrics.port() != 0) {  // metrics.bind_address is an IPv4 address (validate())
    say("mantissa: metrics at http://" + metrics.bind_address() + ":" +
        std::to_string(metrics_->listening_port()) + "/metrics" +
        (world_.size() > 1 ? " (rank 0; every rank at metrics.port + its local rank)" : ""));
  }
  run_dir_cleanup_.keep();
}

Trainer::~Trainer() = default;

// The block recipes' scale modes need a device (and library) that has them: a run that cannot
// have them stops here, before anything trains, rather than scaling differently.
void Trainer::check_fp8_recipe_support() const {
  if (!policy_.fp8_block_gemms) return;
  const core::Fp8Recipe recipe = fp8_scaling_config(config_).recipe;
  if (!core::is_block_recipe(recipe)) return;
  for (const auto& [a, b] : core::kLinearGemmRoles) {
    const std::string why = backend_->unsupported_scale_modes(core::fp8_scale_mode(recipe, a),
                                                              core::fp8_scale_mode(recipe, b));
    require(why.empty(), "precision.fp8.recipe", core::fp8_recipe_name(recipe),
            "cannot run on " + device_.name + ": " + why);
  }
}

void Trainer::build_data() {
  const TrainConfig::Data& data = config_.data();
  const ModelShape dims = model_shape(config_.model());
  const uint64_t seed = config_.run().seed();
  // Data problems found while loading (a malformed shard, a corpus shorter than one sequence)
  // are configuration errors like a missing file (the readers throw them as such); a failure
  // of the machine (mantissa-tokenize killed, memory) is not.
  train::Corpus corpus;
  std::optional<train::Corpus> validation;
  if (data.has_text_file()) {
    auto [head, tail] = train::Corpus::text_file(data.text_file().path())
                            .split_tail(data.text_file().val_fraction());
    corpus = std::move(head);
    if (data.text_file().val_fraction() > 0.0) validation = std::move(tail);
  } else if (data.has_token_shards()) {
    const int64_t vocab = dims.vocab_size;
    corpus = train::Corpus::token_shards(data.token_shards().pattern(), vocab);
    const std::string& val_pattern = data.token_shards().val_pattern();
    if (!val_pattern.empty()) validation = train::Corpus::token_shards(val_pattern, vocab);
  } else {
    corpus = train::Corpus::synthetic(seed, data.synthetic().n_tokens());
    if (data.synthetic().val_tokens() > 0) {
      validation = train::Corpus::synthetic_validation(seed, data.synthetic().val_tokens());
    }
  }
  const auto identity = [](const train::Corpus& c) {
    return CorpusIdentity{c.name(), c.num_tokens(), c.fingerprint()};
  };
  train_data_ = identity(corpus);
  // The run's tokenizer (data.tokenizer, or the shards'), which sample and export use: one that
  // is no exact SentencePiece model, or has more pieces than the model has ids (which would
  // stop training at the first batch holding a token past them, maybe hours in), is refused
  // now. Rank 0 asks mantissa-tokenize (one process for the job, not one per rank) and tells
  // the others its refusal, which every rank then reports as the job's: before the validation
  // windows are read, where a vocabulary too small for the tokenizer would also show, on each
  // rank in its own words. After the shards' own checks: the tokenizer beside an unfinished
  // encode may not be theirs. A checkpoint records what the token ids mean (the tokenizer's
  // CRC), so that a resume with another one is told (rank 0 alone reports and writes the
  // manifest).
  std::string tokenizer_refusal;
  if (world_.rank() == 0) {
    if (const std::optional<std::string> path = run_tokenizer_file(config_)) {
      const std::string source =
          data.tokenizer().empty() ? "the shards' tokenizer" : "data.tokenizer";
      try {
        const TokenizerClient tokenizer = [&] {
          try {
            return TokenizerClient(*path);
          } catch (const core::ConfigError& e) {
            throw core::ConfigError(source + ": " + e.what());
          }
        }();
        require(tokenizer.vocab_size() <= dims.vocab_size, dims.prefix + ".vocab_size",
                std::to_string(dims.vocab_size),
                "is smaller than the " + std::to_string(tokenizer.vocab_size()) +
                    " pieces of the tokenizer " + *path + " (" + source + ")");
        tokenizer_file_ = *path;
        tokenizer_crc32c_ = file_crc32c(*path);
        require_shards_own_tokenizer();
      } catch (const core::ConfigError& e) {
        tokenizer_refusal = e.what();
      }
    }
  }
  if (world_.size() > 1) {
    // Rank 0's CRC and refusal ("<crc> <refusal>") on every rank: all of them refuse a resume
    // with another tokenizer alike (require_same_tokenizer).
    std::istringstream told(
        world_.all_gather(std::to_string(tokenizer_crc32c_) + " " + tokenizer_refusal,
                          config_.dist().timeout_s())[0]);
    told >> tokenizer_crc32c_;
    told.get();  // the space
    std::getline(told, tokenizer_refusal, '\0');
  }
  if (!tokenizer_refusal.empty()) throw RanksDisagree(tokenizer_refusal);
  train::DataLoaderConfig loader;
  loader.seq_len = dims.seq_len;
  loader.micro_batch = data.micro_batch_size();
  loader.world_size = world_.size();
  loader.rank = world_.rank();
  loader.seed = seed;
  loader.sampling = data.sampling() == TrainConfig::Data::RANDOM ? train::WindowSampling::kRandom
                                                                 : train::WindowSampling::kEpochs;
  try {
    loader_ = std::make_unique<train::DataLoader>(
        std::make_shared<const train::Corpus>(std::move(corpus)), loader);
  } catch (const train::TrainingDataTooShort& e) {
    // Name the settings that decide the windows and the tokens they are cut from. Each token
    // shard is a segment of its own (more shards make none longer); holding out less helps
    // only a text that is long enough as a whole. Synthetic data too short for a window is
    // refused at validation. A resumed GPT-2's or MLP's seq_len is its checkpoint's: named
    // where the data hold a window of it.
    std::string remedy = std::string(e.what()) + "; ";
    const std::optional<int64_t> kept = seq_len_a_resume_keeps();
    if (!kept) {
      remedy += "lower " + dims.prefix + ".seq_len, or ";
    } else if (*kept != dims.seq_len && *kept < e.longest()) {
      remedy += "resume with the checkpoint's " + dims.prefix +
                ".seq_len = " + std::to_string(*kept) + ", or ";
    }
    if (data.has_token_shards()) {
      remedy += "give shards of at least seq_len + 1 tokens (data.token_shards.pattern)";
    } else {
      remedy += "train on a longer text (data.text_file.path)";
      const int64_t whole_text = train_data_.tokens + (validation ? validation->num_tokens() : 0);
      if (validation && whole_text > dims.seq_len) {
        remedy += ", or hold out less (data.text_file.val_fraction = " +
                  core::format_number(data.text_file().val_fraction()) +
                  " keeps that part of the text's end for evaluation)";
      }
    }
    throw core::ConfigError(remedy);
  }
  if (config_.run().eval_every() > 0 && validation) {
    validation_data_ = identity(*validation);
    // Block-scaled FP8 inputs take a multiple of a few rows (tokens); training's micro-batches
    // are (config validation), evaluation's cut the validation windows to fit.
    const int64_t token_multiple =
        policy_.fp8_block_gemms ? core::scale_rows_multiple(core::fp8_scale_mode(
                                      fp8_scaling_config(config_).recipe, core::Fp8Role::kInput))
                                : 1;
    try {
      evaluator_ = std::make_unique<train::Evaluator>(
          std::make_shared<const train::Corpus>(std::move(*validation)), dims.seq_len,
          config_.run().eval_tokens(), data.micro_batch_size(), world_.size(), world_.rank(),
          token_multiple);
    } catch (const train::ValidationTooSmall& e) {
      // Name the settings that change the validation set's size.
      const char* held_out = data.has_text_file()      ? "data.text_file.val_fraction"
                             : data.has_token_shards() ? "data.token_shards.val_pattern"
                                                       : "data.synthetic.val_tokens";
      throw core::ConfigError(std::string(e.what()) + "; hold out more (" + held_out +
                              ") or evaluate nothing (run.eval_every=0)");
    }
    // The same windows of the same tokens give comparable losses, whatever else changed.
    for (const uint64_t part :
         {validation_data_.fingerprint, static_cast<uint64_t>(validation_data_.tokens),
          static_cast<uint64_t>(dims.seq_len), static_cast<uint64_t>(evaluator_->tokens())}) {
      validation_key_ = core::mix64(validation_key_ ^ part);
    }
  }
}

std::string Trainer::build_metrics() {
  const TrainConfig::Metrics& m = config_.metrics();
  metrics::MetricsOptions options;
  options.bind_address = m.bind_address();
  options.port = m.port() == 0 ? 0 : m.port() + world_.local_rank();
  options.rank = world_.rank();
  options.build_labels = {{"version", build_version()}, {"revision", build_commit()}};
  options.pushgateway_url = m.pushgateway_url();
  options.job = m.job();
  options.push_every = static_cast<int>(m.push_every());
  // The peak behind MFU, returned to be said at the start: a CPU's is nominal, and no figure
  // reads without it.
  char peak_note[256];
  if (m.peak_tflops() > 0.0) {
    options.peak_flops = m.peak_tflops() * 1e12;
    std::snprintf(peak_note, sizeof peak_note,
                  "mantissa: MFU against %g TFLOP/s per rank (metrics.peak_tflops)",
                  m.peak_tflops());
  } else if (device_.cuda) {
    options.peak_flops = core::gpu_bf16_peak_flops(device_.name);
    if (options.peak_flops > 0) {
      std::snprintf(peak_note, sizeof peak_note,
                    "mantissa: MFU against %g TFLOP/s per rank (the %s's dense BF16 peak)",
                    options.peak_flops / 1e12, device_.name.c_str());
    } else {
      std::snprintf(peak_note, sizeof peak_note,
                    "mantissa: MFU not reported: no peak known for the %s (set "
                    "metrics.peak_tflops)",
                    device_.name.c_str());
    }
  } else {
    // Threads beyond the CPUs they may use take turns: they add no peak.
    const int threads = omp_get_max_threads();
    options.peak_flops = core::cpu_nominal_peak_flops(cpus_in_use_);
    const std::string turns =
        threads > cpus_in_use_ ? " (its " + std::to_string(threads) + " threads take turns)" : "";
    std::snprintf(peak_note, sizeof peak_note,
                  "mantissa: MFU against %g GFLOP/s per rank, a nominal %g per CPU x %d%s "
                  "(metrics.peak_tflops sets a measured one, e.g. build/bin/fma_peak's)",
                  options.peak_flops / 1e9, core::cpu_nominal_peak_flops(1) / 1e9, cpus_in_use_,
                  turns.c_str());
  }
  const TrainConfig::Precision::LossScale& scale = config_.precision().loss_scale();
  options.run_steps = config_.run().steps();
  // The floor as the scaler holds it, a float: the alert's `mantissa_loss_scale <=
  // mantissa_loss_scale_min` never held at a floor of 0.1 exported as the double 0.1.
  options.loss_scale_min = scale.mode() == TrainConfig::Precision::LossScale::DYNAMIC
                               ? static_cast<float>(scale.min())
                               : 0.0;
  // Its errors name the fields, with their kind: a busy port is a failure (exit 1: a later
  // start may find it free), a malformed address or URL a config error.
  metrics_ = std::make_unique<metrics::Metrics>(std::move(options));
  return peak_note;
}

void Trainer::import_initial_weights() {
  const std::string& path = config_.model().init_from();
  // Every rank reads the file (a shared file system, like the data), so a file that does not
  // fit the model is found on every rank alike; the broadcast that follows keeps them equal.
  const bool hf = is_hf_directory(path);
  try {
    if (hf) {
      import_hf_directory(path, hf_layout_of(*model_, "model.init_from"), model_->parameters(),
                          *backend_);
    } else {
      models::import_llmc_gpt2(path, dynamic_cast<models::GPT2&>(*model_), *backend_);
    }
  } catch (const core::Error& e) {
    // The readers say which input is wrong (a config error) or what failed (the machine).
    core::throw_error_of_kind(e.kind(), "model.init_from = \"" + path + "\": " + e.what());
  }
  say(std::string("mantissa: initial weights from the ") +
      (hf ? "Hugging Face model " : "llm.c model ") + path);
}

std::optional<int64_t> Trainer::seq_len_a_resume_keeps() const {
  if (config_.model().has_llama() ||
      config_.checkpoint().resume() == TrainConfig::Checkpoint::NEVER) {
    return std::nullopt;
  }
  try {
    const checkpoint::Checkpointer checkpointer(
        checkpoint::CheckpointOptions{run_checkpoints_dir(run_dir_), 0},
        checkpoint::CheckpointGroup{}, *backend_);
    const std::optional<checkpoint::CheckpointState> newest = checkpointer.newest_manifest();
    if (!newest) return std::nullopt;
    const std::optional<TrainConfig> recorded = recorded_config(newest->config_text);
    if (!recorded || recorded->model().arch_case() != config_.model().arch_case()) {
      return std::nullopt;
    }
    return model_shape(recorded->model()).seq_len;
  } catch (const checkpoint::CheckpointUnreadable&) {
    return std::nullopt;  // the resume says what it cannot read
  }
}

RankStart Trainer::rank_start() const {
  RankStart start;
  start.build = build_name();
  start.cuda = device_.cuda;
  start.device =
      device_.cuda ? device_.name + " on cuda:" + std::to_string(device_.index) : device_.name;
  start.pci_address = device_.pci_address;
  start.boot_id = kernel_boot_id();
  start.train = train_data_;
  start.validation = validation_data_;
  start.settings = shared_settings_text(config_);
  return start;
}

dist::ReplicaState Trainer::replica_state(int64_t steps_done) const {
  dist::ReplicaState state;
  state.step = steps_done;
  state.scaler = scaler_->state();
  if (train::Fp8Operands* fp8 = model_->fp8_operands()) {
    for (const core::Fp8TensorState& t : fp8->registry().state().tensors) {
      state.fp8_scales.push_back(t.scale);
    }
  }
  state.optimizer_steps = optimizer_->steps_taken();
  return state;
}

bool Trainer::maybe_checkpoint(int64_t steps_done, bool force) {
  const int64_t every = config_.checkpoint().every_steps();
  const bool due =
      force || steps_done == config_.run().steps() || (every > 0 && steps_done % every == 0);
  if (!due || steps_done == last_saved_step_) return false;
  save_checkpoint(steps_done);
  return true;
}

AgreedStop Trainer::agreed_stop() {
  const int signal = stop_signal();
  const StopRequest here = signal == SIGINT ? StopRequest::kInterrupt
                           : signal != 0    ? StopRequest::kStop
                                            : StopRequest::kNone;
  // The requests are ordered by urgency, so a MAX over the ranks picks the most urgent.
  std::vector<float> stop{static_cast<float>(static_cast<int>(here)),
                          log_failure_.empty() ? 0.0f : 1.0f};
  dp_->max_across_ranks(stop);
  return {static_cast<StopRequest>(static_cast<int>(stop[0])), stop[1] != 0.0f};
}

std::vector<Trainer::StateBuffer> Trainer::state_buffers() {
  train::ParameterStore& params = model_->parameters();
  return {{"masters", params.masters(), params.masters_begin()},
          {"adam_m", optimizer_->first_moment(), optimizer_->owned_begin()},
          {"adam_v", optimizer_->second_moment(), optimizer_->owned_begin()}};
}

std::vector<checkpoint::BufferSlice> Trainer::checkpoint_slices() {
  const int64_t n = model_->parameters().flat_numel();
  checkpoint::ReplicaPart part{optimizer_->owned_begin(), optimizer_->first_moment().numel()};
  if (config_.dist().zero_stage() == 0)
    part = checkpoint::replica_part(n, world_.rank(), world_.size());
  std::vector<checkpoint::BufferSlice> slices;
  for (const StateBuffer& b : state_buffers()) {
    slices.push_back(
        {b.name, n, part.begin, b.tensor.view(part.begin - b.begin, core::Shape{part.count})});
  }
  return slices;
}

void Trainer::save_checkpoint(int64_t steps_done) {
  const dist::World::Activity saving(world_, "saving the checkpoint of step " +
                                                 std::to_string(steps_done) +
                                                 " (the next run removes what it wrote)");
  const Clock::time_point start = Clock::now();
  metrics_->record_checkpoint_start();
  // A checkpoint of replicas that disagree would preserve the disagreement: check first.
  dp_->check_consistency(replica_state(steps_done));

  train::ParameterStore& params = model_->parameters();
  checkpoint::CheckpointState state;
  state.step = steps_done;
  state.tokens = tokens_total_;
  state.optimizer_steps = optimizer_->steps_taken();
  state.seed = config_.run().seed();
  state.zero_stage = config_.dist().zero_stage();
  state.loss_scaler = scaler_->state();
  if (train::Fp8Operands* fp8 = model_->fp8_operands()) state.fp8 = fp8->registry().state();
  state.data = loader_->cursor();
  state.data_fingerprint = train_data_.fingerprint;
  state.tokenizer_crc32c = tokenizer_crc32c_;
  state.config_text = to_text(config_);
  state.written_by = build_name();
  state.saved_unix_time = metrics::unix_time_now();
  if (const std::optional<metrics::ValLossTrend> trend = metrics_->val_loss_trend()) {
    state.last_val_loss = trend->last_val_loss;
    state.val_loss_rises = trend->rises;
    state.validation_key = validation_key_;
  }
  state.parameters = checkpoint::parameter_layout(params);

  // The steps up to this checkpoint stay in the log whatever happens to the machine: a resume
  // from it appends after them. A log that cannot be synced does not cost the checkpoint.
  if (log_failure_.empty()) {
    try {
      log_->sync();
    } catch (const core::Error& e) {
      step_log_failed(e.what());
    }
  }
  const std::string dir = checkpointer_->save(state, checkpoint_slices());
  last_saved_step_ = steps_done;
  const double seconds = seconds_since(start);
  metrics_->record_checkpoint(steps_done, seconds, state.saved_unix_time);
  progress_.add_checkpoint_seconds(seconds);
  char line[512];
  std::snprintf(line, sizeof line, "mantissa: checkpoint %s written in %.2f s", dir.c_str(),
                seconds);
  say(line);
}

Trainer::Evaluation Trainer::maybe_evaluate(int64_t steps_done, StopRequest signal) {
  const int64_t every = config_.run().eval_every();
  const int64_t total = config_.run().steps();
  if (!evaluator_ || (steps_done % every != 0 && steps_done != total)) return {};
  // A signal's stop comes first, also after the last step: the checkpoint it waits for follows
  // the evaluation, and a scheduler's grace period would otherwise be spent evaluating.
  if (signal != StopRequest::kNone) return {std::nullopt, true};
  const dist::World::Activity evaluating(world_,
                                         "evaluating after step " + step_of(steps_done, total));
  Clock::time_point last_note = Clock::now();
  const auto progress = [&](int64_t done, int64_t micro_batches) {
    metrics_->record_evaluating();
    if (seconds_since(last_note) >= kEvaluationNoteSeconds) {
      last_note = Clock::now();
      say("mantissa: evaluating after step " + step_of(steps_done, total) + ": " +
          std::to_string(done) + " of " + std::to_string(micro_batches) + " micro-batches");
    }
    // A signal's stop on any rank ends the evaluation on every rank at the same micro-batch:
    // the ranks agree after each one (a rank that gave up alone would wait for the others'
    // whole evaluation, past dist.timeout_s for a long one).
    return agreed_stop().signal == StopRequest::kNone;
  };
  const std::optional<double> local =
      evaluator_->local_loss_sum(*model_, *backend_, policy_, progress);
  if (!local) return {std::nullopt, true};
  return {dp_->sum_across_ranks(*local) / static_cast<double>(evaluator_->tokens()), false};
}

void Trainer::require_shards_own_tokenizer() {
  const TrainConfig::Data& data = config_.data();
  const std::optional<std::string> shards_own = shards_tokenizer_file(config_);
  if (data.tokenizer().empty() || !shards_own || file_crc32c(*shards_own) == tokenizer_crc32c_) {
    return;
  }
  // The shards' ids are the pieces of the tokenizer that encoded them: another one would make
  // sample and export read them as other text (and a resume without data.tokenizer would then
  // be refused as a change of tokenizer). Almost always a mistake, so refused unless allowed.
  const std::string differs = "data.tokenizer = \"" + data.tokenizer() +
                              "\" is another than the tokenizer that encoded the shards, " +
                              *shards_own;
  if (!data.allow_tokenizer_change()) {
    throw core::ConfigError(differs +
                            ", so the token ids would stand for other text; leave data.tokenizer "
                            "empty, or set data.allow_tokenizer_change=true to train with it (a "
                            "run that has trained with it resumes only so)");
  }
  say("mantissa: warning: " + differs +
      ": sample and export read the token ids with data.tokenizer (data.allow_tokenizer_change)");
}

void Trainer::say(const std::string& line) {
  if (world_.rank() != 0) return;
  // What runs comes first, before the start's first note (a resume's, the metrics address);
  // a start refused before any note stays one line.
  if (!banner_said_) {
    banner_said_ = true;
    progress_.note(build_name());
  }
  progress_.note(line);
}

void Trainer::step_log_failed(const std::string& why) {
  log_failure_ = why;
  const std::string line = "mantissa: rank " + std::to_string(world_.rank()) + ": " + why +
                           "; no more is written to it, and the run stops with a checkpoint";
  if (world_.rank() == 0) {
    progress_.note(line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

int Trainer::run() {
  const int64_t total = config_.run().steps();
  const int64_t accum = config_.data().grad_accum_steps();
  const int64_t check_every = config_.dist().consistency_check_every();
  const int world_size = world_.size();
  train::Fp8Operands* fp8 = model_->fp8_operands();
  if (start_step_ >= total) {
    say("mantissa: nothing to train: the run resumed at step " + std::to_string(start_step_) +
        " and run.steps is " + std::to_string(total) + "; raise run.steps to train further");
    metrics_->record_finished();
    return kExitOk;
  }

  // A stop that came during the setup (a preemption while shards or a checkpoint loaded) ends
  // the run before its first step: a step and a save would only spend the grace period, and
  // nothing has changed since the newest checkpoint.
  if (const AgreedStop stop = agreed_stop(); stop.stops()) {
    progress_.finish();
    say("mantissa: " + stop_cause(stop) + " during the start: stopped before step " +
        step_of(start_step_ + 1, total) +
        (start_step_ > 0 ? "; the checkpoint of step " + std::to_string(start_step_) +
                               " stays the newest; run the same command to continue"
                         : "; no checkpoint yet: the same command starts the run afresh"));
    metrics_->record_finished();
    return stop_exit_code(stop);
  }
  note_training_begun();

  // End the run as diverged at step `step` (0-based), saying why.
  const auto diverged = [&](int64_t step, const std::string& why) {
    progress_.finish();
    say("mantissa: training diverged at step " + step_of(step + 1, total) + ": " + why);
    return kExitDiverged;
  };
  const auto not_finite = [&](int64_t step, const char* what, double value) {
    return diverged(step, std::string(what) + " is not finite (" + std::to_string(value) +
                              ") — lower optimizer.adamw.lr, or check the data");
  };

  for (int64_t step = start_step_; step < total; ++step) {
    const Clock::time_point start = Clock::now();
    const int64_t syncs_before = backend_->host_syncs();
    std::vector<train::Batch> micro_batches;
    for (int64_t i = 0; i < accum; ++i) micro_batches.push_back(loader_->next());

    metrics::StepRecord record;
    const train::StepReport& report = record.report;
    // The scaler gives up on the MAX-reduced overflow flag: every rank throws it at the same
    // step, so every rank logs that step like any other (without evaluating) and then stops
    // cleanly. Anything else ends the job.
    std::string diverged_why;
    try {
      record.report = step_->run(step, micro_batches, dp_.get());
    } catch (const train::StepDiverged& e) {
      record.report = e.report();
      diverged_why = e.what();
    }
    const double mean_loss = dp_->sum_across_ranks(report.loss) / world_size;
    AgreedStop stop = agreed_stop();
    const double seconds = seconds_since(start);
    const int64_t syncs_at_end = backend_->host_syncs();
    // The step's collectives end here: an evaluation's waits on the other ranks are not the
    // step's all-reduce time.
    record.allreduce_seconds = dp_->last_step_comm_seconds();
    record.allreduce_bytes = dp_->last_step_comm_bytes();
    tokens_total_ += report.tokens * world_size;

    record.mean_loss = mean_loss;
    const Clock::time_point eval_start = Clock::now();
    const Evaluation evaluation =
        diverged_why.empty() ? maybe_evaluate(step + 1, stop.signal) : Evaluation{};
    record.val_loss = evaluation.loss;
    if (record.val_loss) record.eval_seconds = seconds_since(eval_start);
    if (evaluation.abandoned) {
      stop = stop.merged(agreed_stop());
      say("mantissa: the evaluation after step " + step_of(step + 1, total) +
          " gave way to the stop: that step has no validation loss");
    }
    record.step_seconds = seconds;
    record.host_syncs = syncs_at_end - syncs_before;
    record.epoch = loader_->epochs_read();
    if (fp8) {
      const core::Fp8ScalingRegistry& registry = fp8->registry();
      for (int i = 0; i < registry.size(); ++i) {
        record.fp8.push_back(
            {registry.tensor(i).name, registry.newest_amax(i), registry.tensor(i).scale});
      }
    }
    if (log_failure_.empty()) {
      try {
        log_->write(record);
      } catch (const core::Error& e) {
        step_log_failed(e.what());
      }
    }
    if (world_.rank() == 0) progress_.update(record, world_size);
    metrics_->record_step(record);

    if (!diverged_why.empty()) return diverged(step, diverged_why);
    if (!std::isfinite(mean_loss)) return not_finite(step, "the loss", mean_loss);
    // Evaluated after the step's update: the weights it left (the last step's, which no later
    // training loss would show) are not finite.
    if (record.val_loss && !std::isfinite(*record.val_loss)) {
      return not_finite(step, "the validation loss after it", *record.val_loss);
    }

    const int64_t steps_done = step + 1;
    if (check_every > 0 && steps_done % check_every == 0) {
      const dist::World::Activity checking(
          world_, "checking that the replicas agree after step " + step_of(steps_done, total));
      dp_->check_consistency(replica_state(steps_done));
    }
    bool stopping = stop.stops() && steps_done < total;
    if (maybe_checkpoint(steps_done, stopping) && steps_done < total) {
      // A save takes long: a stop asked for while it ran ends the run on it, not after one
      // more step and one more save (a preemption's grace period is short); a Ctrl-C during a
      // stop's own save still makes its exit code 130.
      stop = stop.merged(agreed_stop());
      stopping = stop.stops();
    }
    if (stopping) {
      progress_.finish();
      say("mantissa: " + stop_cause(stop) + ": stopped after step " + step_of(steps_done, total) +
          " with a checkpoint; run the same command to continue");
      // A failed log is a failure (exit 1): mantissa_run_finished stays 0 for the alerts.
      if (!stop.log_unwritable) metrics_->record_finished();
      return stop_exit_code(stop);
    }
  }
  progress_.finish();
  say("mantissa: done, " + std::to_string(total) + " steps, " + std::to_string(tokens_total_) +
      " tokens");
  // The last step's log line (or the last sync) failed on this rank: its checkpoint is written,
  // but the log is not whole, a failure of this rank's (exit 1, not finished for the alerts).
  if (!log_failure_.empty()) {
    std::fprintf(stderr, "mantissa: rank %d: the step log misses lines: %s\n", world_.rank(),
                 log_failure_.c_str());
    return kExitFailure;
  }
  metrics_->record_finished();
  return kExitOk;
}

}  // namespace mantissa::launcher
