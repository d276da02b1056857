#include "models/gpt2/gpt2.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "core/error.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

namespace {

constexpr float kInitStd = 0.02f;

// Sets the elements of parameter `index` from `first` on to zero, in the compute copy and in
// the masters the store keeps (all, or a ZeRO-1 shard).
void zero_from(train::ParameterStore& params, int index, int64_t first, core::Backend& backend) {
  const train::Parameter& p = params[index];
  if (first == p.numel()) return;
  Tensor compute = p.compute.view(first, Shape{p.numel() - first});
  backend.fill(compute, 0.0f);
  Tensor& masters = params.masters();
  const int64_t kept_begin = params.masters_begin();
  const int64_t begin = std::max(p.offset + first, kept_begin);
  const int64_t end = std::min(p.offset + p.numel(), kept_begin + masters.numel());
  if (begin < end) {
    Tensor kept = masters.view(begin - kept_begin, Shape{end - begin});
    backend.fill(kept, 0.0f);
  }
}

}  // namespace

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
        c_proj_(store, name(index, "attn.c_proj"), c.n_embd, c.n_embd, residual_std(c), fp8),
        ln_2_(store, name(index, "ln_2"), c.n_embd),
        c_fc_(store, name(index, "mlp.c_fc"), c.n_embd, 4 * c.n_embd, kInitStd, fp8),
        mlp_proj_(store, name(index, "mlp.c_proj"), 4 * c.n_embd, c.n_embd, residual_std(c), fp8) {}

  // x: the residual stream [B*T, C].
  Tensor forward(train::StepContext& ctx, const Tensor& x, int64_t batch, int64_t seq) {
    core::Backend& be = ctx.backend;
    const DType dt = ctx.policy.compute_dtype;
    const int64_t n = batch * seq;

    qkv_ = c_attn_.forward(ctx, ln_1_.forward(ctx, x));
    att_ = Tensor::empty(Shape{batch, n_head_, seq, seq}, dt, be.device());
    Tensor attended = Tensor::empty(Shape{batch, seq, channels_}, dt, be.device());
    be.attention_forward(qkv_.reshape(Shape{batch, seq, 3 * channels_}), attended, att_,
                         static_cast<int>(n_head_));
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
    Tensor dqkv = Tensor::empty(Shape{batch_, seq_, 3 * channels_}, dt, be.device());
    be.attention_backward(dattended.reshape(Shape{batch_, seq_, channels_}),
                          qkv_.reshape(Shape{batch_, seq_, 3 * channels_}), att_, dqkv,
                          static_cast<int>(n_head_));
    Tensor dx = ln_1_.backward(ctx, c_attn_.backward(ctx, dqkv.reshape(qkv_.shape())));
    be.add(dx, dx2, dx);
    qkv_ = att_ = fc_out_ = Tensor();
    return dx;
  }

 private:
  static std::string name(int index, const char* part) {
    return "h." + std::to_string(index) + "." + part;
  }
  static float residual_std(const GPT2Config& c) {
    return kInitStd / std::sqrt(2.0f * static_cast<float>(c.n_layer));
  }

  int64_t n_head_, channels_;
  LayerNorm ln_1_;
  Linear c_attn_, c_proj_;
  LayerNorm ln_2_;
  Linear c_fc_, mlp_proj_;
  int64_t batch_ = 0, seq_ = 0;
  Tensor qkv_, att_, fc_out_;
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
  params_.allocate(backend, policy.compute_dtype, seed, shard);
  // The padding rows of wte start at zero, as in llm.c's model files, and stay there: their
  // gradient is exactly zero (no token indexes them and their logits' gradient is 0), so AdamW
  // never moves them and weight decay keeps zero at zero. The real rows keep the values the
  // store drew, the same as an unpadded wte's (a value depends on its element index).
  zero_from(params_, wte_, c.vocab_size * c.n_embd, backend);
  if (fp8_) fp8_->allocate(backend, fp8);
}

GPT2::~GPT2() = default;

double GPT2::forward(train::StepContext& ctx, const train::BatchTensors& batch,
                     float dloss_per_token) {
  core::Backend& be = ctx.backend;
  const DType dt = ctx.policy.compute_dtype;
  MANTISSA_CHECK(batch.tokens.shape().rank() == 2 && batch.tokens.shape() == batch.targets.shape(),
                 "GPT2.forward: tokens " << batch.tokens.describe() << " and targets "
                                         << batch.targets.describe() << " must both be [B, T]");
  const int64_t b = batch.tokens.dim(0), t = batch.tokens.dim(1), n = b * t;
  const int64_t channels = config_.n_embd, padded_vocab = config_.padded_vocab_size();
  MANTISSA_CHECK(t <= config_.seq_len,
                 "GPT2.forward: sequence length " << t << " exceeds seq_len " << config_.seq_len);

  Tensor x = Tensor::empty(Shape{b, t, channels}, dt, be.device());
  const Tensor wpe = params_[wpe_].compute.view(0, Shape{t, channels});
  be.embedding_forward(batch.tokens, params_[wte_].compute, wpe, x);
  Tensor residual = x.reshape(Shape{n, channels});
  for (auto& block : blocks_) residual = block->forward(ctx, residual, b, t);
  final_hidden_ = ln_f_->forward(ctx, residual);

  // The tied LM head over the padded vocabulary; logits (and then dlogits, in place) in FP32
  // for an exact loss, which sees the first vocab_size columns only.
  logits_ = Tensor::empty(Shape{n, padded_vocab}, DType::kF32, be.device());
  core::GemmParams head;
  head.trans_b = true;
  be.gemm(final_hidden_, params_[wte_].compute, logits_, head);
  Tensor losses = Tensor::empty(Shape{n}, DType::kF32, be.device());
  const bool training = dloss_per_token > 0.0f;
  be.softmax_cross_entropy(logits_, config_.vocab_size, batch.targets, losses,
                           training ? &logits_ : nullptr, dloss_per_token);

  Tensor host_losses = Tensor::empty(Shape{n}, DType::kF32);
  be.copy(losses, host_losses);
  be.synchronize();
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += host_losses.data_as<float>()[i];
  if (training) {
    batch_ = batch;
  } else {
    final_hidden_ = logits_ = Tensor();
  }
  return sum / static_cast<double>(n);
}

void GPT2::backward(train::StepContext& ctx) {
  MANTISSA_CHECK(logits_.defined(), "GPT2.backward: no training forward pass to differentiate");
  core::Backend& be = ctx.backend;
  const DType dt = ctx.policy.compute_dtype;
  const int64_t b = batch_.tokens.dim(0), t = batch_.tokens.dim(1), n = b * t;
  const int64_t channels = config_.n_embd;
  train::Parameter& wte = params_[wte_];

  // GEMM operands share one dtype: the FP32 dlogits are rounded to the compute dtype. Their
  // padding columns are exactly 0, so the padding rows of wte add nothing to dresidual and
  // receive nothing in wte.grad.
  Tensor dlogits = logits_;
  if (dt != DType::kF32) {
    dlogits = Tensor::empty(logits_.shape(), dt, be.device());
    be.cast(logits_, dlogits, core::CastParams{});
  }
  Tensor dresidual = Tensor::empty(Shape{n, channels}, dt, be.device());
  be.gemm(dlogits, wte.compute, dresidual, core::GemmParams{});
  core::GemmParams wte_grad;
  wte_grad.trans_a = true;
  wte_grad.beta = 1.0f;
  be.gemm(dlogits, final_hidden_, wte.grad, wte_grad);
  logits_ = final_hidden_ = Tensor();

  dresidual = ln_f_->backward(ctx, dresidual);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    dresidual = (*it)->backward(ctx, dresidual);
  }
  Tensor dwpe = params_[wpe_].grad.view(0, Shape{t, channels});
  be.embedding_backward(dresidual.reshape(Shape{b, t, channels}), batch_.tokens, wte.grad, dwpe);
  ctx.mark_grad_ready(wpe_);
  ctx.mark_grad_ready(wte_);
  batch_ = train::BatchTensors{};
}

int64_t GPT2::parameter_count() const {
  const int64_t padding = (config_.padded_vocab_size() - config_.vocab_size) * config_.n_embd;
  return params_.parameter_count() - padding;
}

double GPT2::flops_per_token() const {
  // 6 FLOPs per parameter per token (2 forward, 4 backward) plus the attention score and
  // value products, which have no parameters: 6 * L * C * T (llm.c's and PaLM's estimate).
  // The parameters are the true model's: the vocabulary padding's rows are multiplied too but
  // compute nothing the model needs, so MFU counts useful work only (and an unpadded run
  // would report the same FLOPs per token). llm.c counts them; for GPT-2 124M the two differ
  // by 47 x 768 parameters, 0.03%.
  const auto n = static_cast<double>(parameter_count());
  return 6.0 * n + 6.0 * static_cast<double>(config_.n_layer * config_.n_embd * config_.seq_len);
}

}  // namespace mantissa::models
