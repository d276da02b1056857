#include "launcher/config/config_translate.h"

namespace mantissa::launcher {

namespace {

using Config = TrainConfig;

}  // namespace

ModelShape model_shape(const TrainConfig::Model& model) {
  if (model.has_mlp()) return {"model.mlp", model.mlp().seq_len(), model.mlp().vocab_size()};
  if (model.has_llama()) {
    return {"model.llama", model.llama().seq_len(), model.llama().vocab_size()};
  }
  return {"model.gpt2", model.gpt2().seq_len(), model.gpt2().vocab_size()};
}

core::PrecisionPolicy precision_policy(const TrainConfig& config) {
  switch (config.precision().mode()) {
    case Config::Precision::BF16:
      return core::PrecisionPolicy::from_mode(core::PrecisionMode::kBF16);
    case Config::Precision::FP16:
      return core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP16);
    case Config::Precision::FP8_HYBRID:
      return core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP8Hybrid);
    default: return core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32);
  }
}

core::LossScalerConfig loss_scaler_config(const TrainConfig& config) {
  const Config::Precision::LossScale& s = config.precision().loss_scale();
  core::LossScalerConfig c;
  switch (s.mode()) {
    case Config::Precision::LossScale::STATIC: c.mode = core::LossScaleMode::kStatic; break;
    case Config::Precision::LossScale::NONE: c.mode = core::LossScaleMode::kNone; break;
    default: c.mode = core::LossScaleMode::kDynamic; break;
  }
  c.init = s.init();
  c.growth_factor = s.growth_factor();
  c.backoff_factor = s.backoff_factor();
  c.growth_interval = s.growth_interval();
  c.hysteresis = s.hysteresis();
  c.min = s.min();
  c.max = s.max();
  c.max_overflows_at_min = s.max_overflows_at_min();
  return c;
}

core::Fp8ScalingConfig fp8_scaling_config(const TrainConfig& config) {
  const Config::Precision::Fp8& f = config.precision().fp8();
  core::Fp8ScalingConfig c;
  switch (f.recipe()) {
    case Config::Precision::Fp8::CURRENT: c.recipe = core::Fp8Recipe::kCurrent; break;
    case Config::Precision::Fp8::BLOCKWISE: c.recipe = core::Fp8Recipe::kBlockwise; break;
    case Config::Precision::Fp8::ROWWISE: c.recipe = core::Fp8Recipe::kRowwise; break;
    case Config::Precision::Fp8::MXFP8: c.recipe = core::Fp8Recipe::kMxfp8; break;
    default: c.recipe = core::Fp8Recipe::kDelayed; break;
  }
  c.amax_history_len = f.amax_history_len();
  c.amax_compute = f.amax_compute() == Config::Precision::Fp8::MOST_RECENT
                       ? core::AmaxCompute::kMostRecent
                       : core::AmaxCompute::kMax;
  c.margin = f.margin();
  c.grad_format =
      f.grad_format() == Config::Precision::Fp8::E4M3 ? core::DType::kE4M3 : core::DType::kE5M2;
  c.power_of_two = f.power_of_two_scales();
  return c;
}

core::AdamWConfig adamw_config(const TrainConfig& config) {
  const Config::Optimizer::AdamW& a = config.optimizer().adamw();
  core::AdamWConfig c;
  c.beta1 = static_cast<float>(a.beta1());
  c.beta2 = static_cast<float>(a.beta2());
  c.eps = static_cast<float>(a.eps());
  c.weight_decay = static_cast<float>(a.weight_decay());
  return c;
}

core::LrScheduleConfig lr_schedule_config(const TrainConfig& config) {
  core::LrScheduleConfig c;
  c.lr = config.optimizer().adamw().lr();
  c.warmup_steps = config.optimizer().warmup_steps();
  c.total_steps = config.run().steps();
  c.min_lr_ratio = config.optimizer().min_lr_ratio();
  return c;
}

dist::DistConfig dist_config(const TrainConfig& config) {
  const Config::Dist& d = config.dist();
  dist::DistConfig c;
  switch (d.backend()) {
    case Config::Dist::MPI: c.backend = dist::CommBackend::kMPI; break;
    case Config::Dist::NCCL: c.backend = dist::CommBackend::kNCCL; break;
    default: c.backend = dist::CommBackend::kAuto; break;
  }
  switch (d.grad_reduce_dtype()) {
    case Config::Dist::FP32: c.grad_reduce_dtype = core::DType::kF32; break;
    case Config::Dist::FP16: c.grad_reduce_dtype = core::DType::kF16; break;
    case Config::Dist::FP8_E4M3: c.grad_reduce_dtype = core::DType::kE4M3; break;
    case Config::Dist::FP8_E5M2: c.grad_reduce_dtype = core::DType::kE5M2; break;
    default: c.grad_reduce_dtype = core::DType::kBF16; break;
  }
  c.accumulate_fp32 = d.accumulate_fp32();
  c.bucket_mb = d.bucket_mb();
  c.overlap = d.overlap();
  c.zero_stage = d.zero_stage();
  c.timeout_s = d.timeout_s();
  c.consistency_check_every = d.consistency_check_every();
  return c;
}

}  // namespace mantissa::launcher
