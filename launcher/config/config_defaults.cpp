// The default table: every field a config leaves unset gets its value here, so the effective
// config lists every value (and `mantissa train --help` shows the table).
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>

#include "core/int_math.h"
#include "launcher/config/config.h"
#include "launcher/config/config_fields.h"

namespace mantissa::launcher {

namespace {

using Config = TrainConfig;

// Llama's SwiGLU width: 8/3 n_embd (the parameters of a 4 n_embd GELU MLP in three matrices
// instead of two), rounded up to a multiple of 64 as Llama rounds it (to 256 there).
int64_t default_ffn_hidden(int64_t n_embd) {
  constexpr int64_t kMultiple = 64;
  const int64_t width = (8 * n_embd + 2) / 3;
  return core::round_up(width, kMultiple);
}

// Defaults. Applied through the same reflection as --set, to fields that are still unset, so
// the table reads like a config file. The defaults that depend on other fields are applied in
// apply_defaults itself: precision.loss_scale.mode (DYNAMIC for FP16, NONE otherwise),
// precision.fp8.grad_format and power_of_two_scales (from the recipe),
// dist.grad_reduce_dtype (FP32 for precision.mode FP32, BF16 otherwise),
// model.llama.n_kv_head (n_head) and ffn_hidden (from n_embd), run.eval_every (on when the
// data has a validation set) and run.dir (runs/<config file name without extension>).

constexpr std::pair<std::string_view, std::string_view> kDefaults[] = {
    {"run.steps", "1000"},
    {"run.seed", "1"},
    {"run.device", "AUTO"},
    {"run.log_every", "10"},
    {"run.eval_tokens", "16384"},
    {"model.gpt2.n_layer", "6"},
    {"model.gpt2.n_head", "6"},
    {"model.gpt2.n_embd", "384"},
    {"model.gpt2.seq_len", "256"},
    {"model.gpt2.vocab_size", "256"},
    {"model.llama.n_layer", "6"},
    {"model.llama.n_head", "6"},
    {"model.llama.n_embd", "384"},
    {"model.llama.seq_len", "256"},
    {"model.llama.vocab_size", "256"},
    {"model.llama.rope_theta", "10000"},
    {"model.llama.norm_eps", "1e-05"},
    {"model.llama.tie_embeddings", "false"},
    {"model.mlp.n_embd", "64"},
    {"model.mlp.hidden", "256"},
    {"model.mlp.seq_len", "64"},
    {"model.mlp.vocab_size", "256"},
    {"model.init_from", ""},
    {"data.synthetic.n_tokens", "2097152"},
    {"data.synthetic.val_tokens", "65536"},
    {"data.text_file.val_fraction", "0.1"},
    {"data.micro_batch_size", "8"},
    {"data.grad_accum_steps", "1"},
    {"data.tokenizer", ""},
    {"data.allow_tokenizer_change", "false"},
    {"data.sampling", "EPOCHS"},
    {"optimizer.adamw.lr", "0.0006"},
    {"optimizer.adamw.beta1", "0.9"},
    {"optimizer.adamw.beta2", "0.95"},
    {"optimizer.adamw.eps", "1e-08"},
    {"optimizer.adamw.weight_decay", "0.1"},
    {"optimizer.grad_clip", "1"},
    {"optimizer.warmup_steps", "0"},
    {"optimizer.min_lr_ratio", "0"},
    {"precision.mode", "BF16"},
    {"precision.loss_scale.init", "65536"},
    {"precision.loss_scale.growth_factor", "2"},
    {"precision.loss_scale.backoff_factor", "0.5"},
    {"precision.loss_scale.growth_interval", "2000"},
    {"precision.loss_scale.hysteresis", "2"},
    {"precision.loss_scale.min", "1"},
    {"precision.loss_scale.max", "16777216"},
    {"precision.loss_scale.max_overflows_at_min", "10"},
    {"precision.fp8.recipe", "DELAYED"},
    {"precision.fp8.amax_history_len", "1024"},
    {"precision.fp8.amax_compute", "MAX"},
    {"precision.fp8.margin", "0"},
    {"precision.fp8.allow_recipe_change", "false"},
    {"dist.backend", "AUTO"},
    {"dist.accumulate_fp32", "false"},
    {"dist.bucket_mb", "25"},
    {"dist.overlap", "true"},
    {"dist.zero_stage", "0"},
    {"dist.timeout_s", "300"},
    {"dist.consistency_check_every", "100"},
    {"checkpoint.every_steps", "1000"},
    {"checkpoint.keep", "3"},
    {"checkpoint.resume", "AUTO"},
    {"metrics.bind_address", "127.0.0.1"},
    {"metrics.port", "0"},
    {"metrics.pushgateway_url", ""},
    {"metrics.push_every", "10"},
    {"metrics.peak_tflops", "0"},
    {"metrics.job", "mantissa"},
    {"debug.inject_nonfinite_rank", "0"},
};

}  // namespace

bool has_validation_data(const TrainConfig::Data& data) {
  switch (data.source_case()) {
    case Config::Data::kSynthetic: return data.synthetic().val_tokens() > 0;
    case Config::Data::kTextFile: return data.text_file().val_fraction() > 0.0;
    case Config::Data::kTokenShards: return !data.token_shards().val_pattern().empty();
    case Config::Data::SOURCE_NOT_SET: return false;
  }
  return false;
}

void apply_defaults(TrainConfig& config, const std::string& config_path) {
  if (config.model().arch_case() == Config::Model::ARCH_NOT_SET)
    config.mutable_model()->mutable_gpt2();
  if (config.data().source_case() == Config::Data::SOURCE_NOT_SET) {
    config.mutable_data()->mutable_synthetic();
  }
  for (const auto& [path, value] : kDefaults) {
    const FieldRef ref = resolve(config, path, true);
    if (ref.field == nullptr || ref.message->GetReflection()->HasField(*ref.message, ref.field)) {
      continue;
    }
    set_from_text(ref, value);
  }
  Config::Precision::LossScale& scale = *config.mutable_precision()->mutable_loss_scale();
  if (!scale.has_mode()) {
    scale.set_mode(config.precision().mode() == Config::Precision::FP16
                       ? Config::Precision::LossScale::DYNAMIC
                       : Config::Precision::LossScale::NONE);
  }
  Config::Precision::Fp8& fp8 = *config.mutable_precision()->mutable_fp8();
  const bool per_tensor = fp8.recipe() == Config::Precision::Fp8::DELAYED ||
                          fp8.recipe() == Config::Precision::Fp8::CURRENT;
  if (!fp8.has_grad_format()) {
    fp8.set_grad_format(per_tensor ? Config::Precision::Fp8::E5M2 : Config::Precision::Fp8::E4M3);
  }
  if (!fp8.has_power_of_two_scales()) {
    fp8.set_power_of_two_scales(fp8.recipe() == Config::Precision::Fp8::MXFP8);
  }
  // An FP32 run reduces in FP32, as PyTorch DDP reduces in the parameters' dtype: rounding
  // its gradients to BF16 would make it what it was chosen not to be.
  Config::Dist& dist = *config.mutable_dist();
  if (!dist.has_grad_reduce_dtype()) {
    dist.set_grad_reduce_dtype(config.precision().mode() == Config::Precision::FP32
                                   ? Config::Dist::FP32
                                   : Config::Dist::BF16);
  }
  if (config.model().has_llama()) {
    Config::Model::Llama& llama = *config.mutable_model()->mutable_llama();
    if (!llama.has_n_kv_head()) llama.set_n_kv_head(llama.n_head());
    if (!llama.has_ffn_hidden()) llama.set_ffn_hidden(default_ffn_hidden(llama.n_embd()));
  }
  if (!config.run().has_eval_every()) {
    config.mutable_run()->set_eval_every(has_validation_data(config.data()) ? 100 : 0);
  }
  if (!config.run().has_dir()) {
    const std::string stem = std::filesystem::path(config_path).stem().string();
    config.mutable_run()->set_dir("runs/" + (stem.empty() ? std::string("default") : stem));
  }
}

std::string describe_defaults() {
  std::string out;
  for (const auto& [path, value] : kDefaults) {
    out += "  " + std::string(path) + " = " + (value.empty() ? "\"\"" : std::string(value)) + "\n";
  }
  out += "  precision.loss_scale.mode = DYNAMIC for FP16, NONE otherwise\n";
  out += "  precision.fp8.grad_format = E5M2 for DELAYED and CURRENT, E4M3 otherwise\n";
  out += "  precision.fp8.power_of_two_scales = true for MXFP8, false otherwise\n";
  out += "  dist.grad_reduce_dtype = FP32 for precision.mode FP32, BF16 otherwise\n";
  out += "  model.llama.n_kv_head = model.llama.n_head\n";
  out += "  model.llama.ffn_hidden = 8/3 model.llama.n_embd rounded up to a multiple of 64\n";
  out += "  run.eval_every = 100 when the data has a validation set, else 0\n";
  out += "  run.dir = runs/<config file name without extension>\n";
  out += "  model = gpt2 {}, data source = synthetic {} when none is given\n";
  return out;
}

}  // namespace mantissa::launcher
