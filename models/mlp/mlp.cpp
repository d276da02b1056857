#include "models/mlp/mlp.h"

#include "core/error.h"
#include "models/nn/init_std.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

MLP::MLP(const MLPConfig& config, core::Backend& backend, const core::PrecisionPolicy& policy,
         uint64_t seed, const core::Fp8ScalingConfig& fp8, train::MasterShard shard)
    : config_(config) {
  const MLPConfig& c = config_;
  MANTISSA_CHECK(c.n_embd > 0 && c.hidden > 0 && c.seq_len > 0 && c.vocab_size > 0,
                 "MLP: n_embd, hidden, seq_len and vocab_size must be positive");
  if (policy.fp8_block_gemms) fp8_ = std::make_unique<train::Fp8Operands>();
  wte_ = params_.add({"wte", Shape{c.vocab_size, c.n_embd}, train::Init::kNormal, kInitStd, true});
  wpe_ = params_.add({"wpe", Shape{c.seq_len, c.n_embd}, train::Init::kNormal, kInitStd, true});
  fc_ = std::make_unique<Linear>(params_, "fc", c.n_embd, c.hidden, kInitStd, fp8_.get());
  out_ = std::make_unique<Linear>(params_, "out", c.hidden, c.vocab_size, kInitStd, fp8_.get());
  params_.allocate(backend, policy.compute_dtype, seed, shard);
  if (fp8_) fp8_->allocate(backend, fp8);
}

Tensor MLP::compute_logits(train::StepContext& ctx, const Tensor& tokens) {
  core::Backend& be = ctx.backend;
  const DType dt = ctx.policy.compute_dtype;
  MANTISSA_CHECK(tokens.shape().rank() == 2,
                 "MLP: tokens " << tokens.describe() << " must be [B, T]");
  const int64_t b = tokens.dim(0), t = tokens.dim(1), n = b * t;
  MANTISSA_CHECK(t <= config_.seq_len,
                 "MLP: sequence length " << t << " exceeds seq_len " << config_.seq_len);

  Tensor x = Tensor::empty(Shape{b, t, config_.n_embd}, dt, be.device());
  be.embedding_forward(tokens, params_[wte_].compute,
                       params_[wpe_].compute.view(0, Shape{t, config_.n_embd}), x);
  fc_out_ = fc_->forward(ctx, x.reshape(Shape{n, config_.n_embd}));
  Tensor activated = Tensor::empty(fc_out_.shape(), dt, be.device());
  be.gelu_forward(fc_out_, activated);
  return out_->forward(ctx, activated);
}

Tensor MLP::logits(train::StepContext& ctx, const Tensor& tokens) {
  Tensor out = compute_logits(ctx, tokens);
  fc_out_ = logits_ = Tensor();  // what a training forward kept no longer matches
  if (out.dtype() == DType::kF32) return out;
  Tensor widened = Tensor::empty(out.shape(), DType::kF32, ctx.backend.device());
  ctx.backend.cast(out, widened, core::CastParams{});
  return widened;
}

Tensor MLP::forward(train::StepContext& ctx, const train::BatchTensors& batch,
                    float dloss_per_token) {
  core::Backend& be = ctx.backend;
  logits_ = compute_logits(ctx, batch.tokens);
  const int64_t n = logits_.dim(0);

  Tensor losses = Tensor::empty(Shape{n}, DType::kF32, be.device());
  const bool training = dloss_per_token > 0.0f;
  be.softmax_cross_entropy(logits_, config_.vocab_size, batch.targets, losses,
                           training ? &logits_ : nullptr, dloss_per_token);
  if (training) {
    batch_ = batch;
  } else {
    fc_out_ = logits_ = Tensor();
  }
  return losses;
}

void MLP::backward(train::StepContext& ctx) {
  MANTISSA_CHECK(logits_.defined(), "MLP.backward: no training forward pass to differentiate");
  core::Backend& be = ctx.backend;
  const int64_t b = batch_.tokens.dim(0), t = batch_.tokens.dim(1);
  Tensor dactivated = out_->backward(ctx, logits_);
  Tensor dfc = Tensor::empty(fc_out_.shape(), ctx.policy.compute_dtype, be.device());
  be.gelu_backward(fc_out_, dactivated, dfc);
  Tensor dx = fc_->backward(ctx, dfc);
  Tensor dwpe = params_[wpe_].grad.view(0, Shape{t, config_.n_embd});
  be.embedding_backward(dx.reshape(Shape{b, t, config_.n_embd}), batch_.tokens, params_[wte_].grad,
                        dwpe);
  ctx.mark_grad_ready(wpe_);
  ctx.mark_grad_ready(wte_);
  fc_out_ = logits_ = Tensor();
  batch_ = train::BatchTensors{};
}

double MLP::flops_per_token() const {
  return 6.0 * static_cast<double>(parameter_count());
}

}  // namespace mantissa::models
