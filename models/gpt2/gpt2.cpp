#include "models/gpt2/gpt2.h"

#include <string>

#include "core/error.h"
#include "models/nn/init_std.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

// One pre-LayerNorm transformer block:
//   x2  = x  + proj(attention(qkv(ln_1(x))))
//   out = x2 + mlp_proj(gelu(fc(ln_2(x2))))
class GPT2Block {
 public:
  GPT2Block(train::ParameterStore& store, const GPT2Config& c, int index, train::Fp8Operands* fp8)
      : n_head_(c.n_head),
        channels_(c.n_embd),
        ln_1_(store, name(index, "ln_1"), c.n_embd),
        c_attn_(store, name(index, "attn.c_attn"), c.n_embd, 3 * c.n_embd, kInitStd, fp8),
        c_proj_(store, name(index, "attn.c_proj"), c.n_embd, c.n_embd, residual_init_std(c.n_layer),
                fp8),
        ln_2_(store, name(index, "ln_2"), c.n_embd),
        c_fc_(store, name(index, "mlp.c_fc"), c.n_embd, 4 * c.n_embd, kInitStd, fp8),
        mlp_proj_(store, name(index, "mlp.c_proj"), 4 * c.n_embd, c.n_embd,
                  residual_init_std(c.n_layer), fp8) {}

  // x: the residual stream [B*T, C].
  Tensor forward(train::StepContext& ctx, const Tensor& x, int64_t batch, int64_t seq) {
    core::Backend& be = ctx.backend;
    const DType dt = ctx.policy.compute_dtype;
    const int64_t n = batch * seq;

    const Tensor qkv = c_attn_.forward(ctx, ln_1_.forward(ctx, x));
    const Tensor attended =
        attention_.forward(ctx, qkv.reshape(Shape{batch, seq, 3 * channels_}), n_head_);
    Tensor x2 = Tensor::empty(x.shape(), dt, be.device());
    be.add(x, c_proj_.forward(ctx, attended.reshape(Shape{n, channels_})), x2);

    fc_out_ = c_fc_.forward(ctx, ln_2_.forward(ctx, x2));
    Tensor activated = Tensor::empty(fc_out_.shape(), dt, be.device());
    be.gelu_forward(fc_out_, activated);
    Tensor out = Tensor::empty(x.shape(), dt, be.device());
    be.add(x2, mlp_proj_.forward(ctx, activated), out);
    batch_ = batch;
    seq_ = seq;
    return out;
  }

  // dout: gradient of the block output; returns the gradient of its input.
  Tensor backward(train::StepContext& ctx, const Tensor& dout) {
    core::Backend& be = ctx.backend;
    const DType dt = ctx.policy.compute_dtype;

    Tensor dactivated = mlp_proj_.backward(ctx, dout);
    Tensor dfc = Tensor::empty(fc_out_.shape(), dt, be.device());
    be.gelu_backward(fc_out_, dactivated, dfc);
    Tensor dx2 = ln_2_.backward(ctx, c_fc_.backward(ctx, dfc));
    be.add(dx2, dout, dx2);  // the residual branch passes dout straight through

    Tensor dattended = c_proj_.backward(ctx, dx2);
    const Tensor dqkv = attention_.backward(ctx, dattended.reshape(Shape{batch_, seq_, channels_}));
    Tensor dx = ln_1_.backward(
        ctx, c_attn_.backward(ctx, dqkv.reshape(Shape{batch_ * seq_, 3 * channels_})));
    be.add(dx, dx2, dx);
    fc_out_ = Tensor();
    return dx;
  }

 private:
  static std::string name(int index, const char* part) {
    return "h." + std::to_string(index) + "." + part;
  }

  int64_t n_head_, channels_;
  LayerNorm ln_1_;
  Linear c_attn_, c_proj_;
  LayerNorm ln_2_;
  Linear c_fc_, mlp_proj_;
  int64_t batch_ = 0, seq_ = 0;
  CausalSelfAttention attention_;
  Tensor fc_out_;
};

GPT2::GPT2(const GPT2Config& config, core::Backend& backend, const core::PrecisionPolicy& policy,
           uint64_t seed, const core::Fp8ScalingConfig& fp8, train::MasterShard shard)
    : config_(config) {
  const GPT2Config& c = config_;
  MANTISSA_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_embd > 0 && c.seq_len > 0 && c.vocab_size > 0,
                 "GPT2: n_layer, n_head, n_embd, seq_len and vocab_size must be positive");
  MANTISSA_CHECK(c.n_embd % c.n_head == 0, "GPT2: n_embd (" << c.n_embd
                                                            << ") must be a multiple of n_head ("
                                                            << c.n_head << ")");
  if (policy.fp8_block_gemms) fp8_ = std::make_unique<train::Fp8Operands>();
  wte_ = params_.add(
      {"wte", Shape{c.padded_vocab_size(), c.n_embd}, train::Init::kNormal, kInitStd, true});
  wpe_ = params_.add({"wpe", Shape{c.seq_len, c.n_embd}, train::Init::kNormal, kInitStd, true});
  for (int i = 0; i < c.n_layer; ++i) {
    blocks_.push_back(std::make_unique<GPT2Block>(params_, c, i, fp8_.get()));
  }
  ln_f_ = std::make_unique<LayerNorm>(params_, "ln_f", c.n_embd);
  head_ = std::make_unique<LMHead>(params_, wte_, c.vocab_size);  // tied to wte
  params_.allocate(backend, policy.compute_dtype, seed, shard);
  // The padding rows of wte start at zero, as in llm.c's model files, and stay there: their
  // gradient is exactly zero (no token indexes them and their logits' gradient is 0), so AdamW
  // never moves them and weight decay keeps zero at zero. The real rows keep the values the
  // store drew, the same as an unpadded wte's (a value depends on its element index).
  params_.zero_from(backend, wte_, c.vocab_size * c.n_embd);
  if (fp8_) fp8_->allocate(backend, fp8);
}

GPT2::~GPT2() = default;

Tensor GPT2::final_hidden(train::StepContext& ctx, const Tensor& tokens) {
  core::Backend& be = ctx.backend;
  const DType dt = ctx.policy.compute_dtype;
  MANTISSA_CHECK(tokens.shape().rank() == 2,
                 "GPT2: tokens " << tokens.describe() << " must be [B, T]");
  const int64_t b = tokens.dim(0), t = tokens.dim(1), n = b * t;
  const int64_t channels = config_.n_embd;
  MANTISSA_CHECK(t <= config_.seq_len,
                 "GPT2: sequence length " << t << " exceeds seq_len " << config_.seq_len);

  Tensor x = Tensor::empty(Shape{b, t, channels}, dt, be.device());
  const Tensor wpe = params_[wpe_].compute.view(0, Shape{t, channels});
  be.embedding_forward(tokens, params_[wte_].compute, wpe, x);
  Tensor residual = x.reshape(Shape{n, channels});
  for (auto& block : blocks_) residual = block->forward(ctx, residual, b, t);
  return ln_f_->forward(ctx, residual);
}

Tensor GPT2::logits(train::StepContext& ctx, const Tensor& tokens) {
  Tensor out = head_->logits(ctx, final_hidden(ctx, tokens));
  head_->drop();  // what a training forward kept no longer matches
  return out;
}

Tensor GPT2::forward(train::StepContext& ctx, const train::BatchTensors& batch,
                     float dloss_per_token) {
  MANTISSA_CHECK(batch.tokens.shape() == batch.targets.shape(),
                 "GPT2.forward: tokens " << batch.tokens.describe() << " and targets "
                                         << batch.targets.describe() << " must both be [B, T]");
  Tensor losses =
      head_->forward(ctx, final_hidden(ctx, batch.tokens), batch.targets, dloss_per_token);
  batch_ = head_->has_pass() ? batch : train::BatchTensors{};
  return losses;
}

void GPT2::backward(train::StepContext& ctx) {
  MANTISSA_CHECK(head_->has_pass(), "GPT2.backward: no training forward pass to differentiate");
  core::Backend& be = ctx.backend;
  const int64_t b = batch_.tokens.dim(0), t = batch_.tokens.dim(1);
  const int64_t channels = config_.n_embd;

  Tensor dresidual = ln_f_->backward(ctx, head_->backward(ctx));
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    dresidual = (*it)->backward(ctx, dresidual);
  }
  Tensor dwpe = params_[wpe_].grad.view(0, Shape{t, channels});
  be.embedding_backward(dresidual.reshape(Shape{b, t, channels}), batch_.tokens, params_[wte_].grad,
                        dwpe);
  ctx.mark_grad_ready(wpe_);
  ctx.mark_grad_ready(wte_);
  batch_ = train::BatchTensors{};
}

int64_t GPT2::parameter_count() const {
  const int64_t padding = (config_.padded_vocab_size() - config_.vocab_size) * config_.n_embd;
  return params_.parameter_count() - padding;
}

double GPT2::flops_per_token() const {
  // The parameters are the true model's: the vocabulary padding's rows are multiplied too but
  // compute nothing the model needs, so MFU counts useful work only (and an unpadded run
  // would report the same FLOPs per token). llm.c counts them; for GPT-2 124M the two differ
  // by 47 x 768 parameters, 0.03%. The position table is a lookup, no matrix product (llm.c
  // counts it: 0.6% of GPT-2 124M's FLOPs), as Llama leaves out an untied input table.
  const int64_t lookup = config_.seq_len * config_.n_embd;
  return train::transformer_flops_per_token(parameter_count() - lookup, config_.n_layer,
                                            config_.n_embd, config_.seq_len);
}

}  // namespace mantissa::models
