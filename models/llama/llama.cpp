#include "models/llama/llama.h"

#include <string>

#include "core/error.h"
#include "core/ops/rope_table.h"
#include "models/nn/init_std.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

namespace {

std::string layer_name(int index, const char* part) {
  return "layers." + std::to_string(index) + "." + part;
}

}  // namespace

// One pre-RMSNorm decoder block (the equations are llama.h's). Saved for the backward: the
// attention's multi-head q|k|v after RoPE, its probabilities and the SwiGLU input; the norms
// and the linears keep their own inputs.
class LlamaBlock {
 public:
  LlamaBlock(train::ParameterStore& store, const LlamaConfig& c, int index, train::Fp8Operands* fp8)
      : n_head_(c.n_head),
        n_kv_head_(c.n_kv_head),
        head_dim_(c.head_dim()),
        input_norm_(store, layer_name(index, "input_layernorm"), c.n_embd, c.norm_eps),
        qkv_proj_(store, layer_name(index, "self_attn.qkv_proj"), c.n_embd,
                  (c.n_head + 2 * c.n_kv_head) * c.head_dim(), kInitStd, fp8, false),
        o_proj_(store, layer_name(index, "self_attn.o_proj"), c.n_head * c.head_dim(), c.n_embd,
                residual_init_std(c.n_layer), fp8, false),
        post_attention_norm_(store, layer_name(index, "post_attention_layernorm"), c.n_embd,
                             c.norm_eps),
        gate_up_proj_(store, layer_name(index, "mlp.gate_up_proj"), c.n_embd, 2 * c.ffn_hidden,
                      kInitStd, fp8, false),
        down_proj_(store, layer_name(index, "mlp.down_proj"), c.ffn_hidden, c.n_embd,
                   residual_init_std(c.n_layer), fp8, false) {}

  // x: the residual stream [B*T, C]; rope_table: [>= T, D].
  Tensor forward(train::StepContext& ctx, const Tensor& x, const Tensor& rope_table, int64_t batch,
                 int64_t seq) {
    core::Backend& be = ctx.backend;
    const DType dt = ctx.policy.compute_dtype;
    const int64_t n = batch * seq, channels = n_head_ * head_dim_;
    const int64_t heads = n_head_ + 2 * n_kv_head_;

    // q, k and v of every position, then q and k rotated in place (they are the first
    // n_head + n_kv_head heads of each row).
    Tensor qkv = qkv_proj_.forward(ctx, input_norm_.forward(ctx, x));
    Tensor qkv_heads = qkv.reshape(Shape{batch, seq, heads, head_dim_});
    be.rope_forward(qkv_heads, rope_table, 0, n_head_ + n_kv_head_, qkv_heads);
    Tensor expanded;
    if (n_kv_head_ == n_head_) {
      expanded = qkv.reshape(Shape{batch, seq, 3 * channels});
    } else {
      expanded = Tensor::empty(Shape{batch, seq, 3 * channels}, dt, be.device());
      be.repeat_kv_heads(qkv.reshape(Shape{batch, seq, heads * head_dim_}), n_head_, n_kv_head_,
                         expanded);
    }
    const Tensor attended = attention_.forward(ctx, expanded, n_head_);
    Tensor x2 = Tensor::empty(x.shape(), dt, be.device());
    be.add(x, o_proj_.forward(ctx, attended.reshape(Shape{n, channels})), x2);

    gate_up_ = gate_up_proj_.forward(ctx, post_attention_norm_.forward(ctx, x2));
    Tensor activated = Tensor::empty(Shape{n, gate_up_.dim(1) / 2}, dt, be.device());
    be.swiglu_forward(gate_up_, activated);
    Tensor out = Tensor::empty(x.shape(), dt, be.device());
    be.add(x2, down_proj_.forward(ctx, activated), out);
    batch_ = batch;
    seq_ = seq;
    return out;
  }

  // dout: gradient of the block output; returns the gradient of its input.
  Tensor backward(train::StepContext& ctx, const Tensor& dout, const Tensor& rope_table) {
    core::Backend& be = ctx.backend;
    const DType dt = ctx.policy.compute_dtype;
    const int64_t n = batch_ * seq_, channels = n_head_ * head_dim_;
    const int64_t heads = n_head_ + 2 * n_kv_head_;

    // The SwiGLU gradient overwrites its saved input, which nothing needs afterwards.
    be.swiglu_backward(down_proj_.backward(ctx, dout), gate_up_, gate_up_);
    Tensor dx2 = post_attention_norm_.backward(ctx, gate_up_proj_.backward(ctx, gate_up_));
    be.add(dx2, dout, dx2);  // the residual branch passes dout straight through

    Tensor dattended = o_proj_.backward(ctx, dx2);
    const Tensor dqkv_expanded =
        attention_.backward(ctx, dattended.reshape(Shape{batch_, seq_, channels}));
    Tensor dqkv = dqkv_expanded;
    if (n_kv_head_ != n_head_) {
      dqkv = Tensor::empty(Shape{batch_, seq_, heads * head_dim_}, dt, be.device());
      be.repeat_kv_heads_backward(dqkv_expanded, n_head_, n_kv_head_, dqkv);
    }
    Tensor dqkv_heads = dqkv.reshape(Shape{batch_, seq_, heads, head_dim_});
    be.rope_backward(dqkv_heads, rope_table, 0, n_head_ + n_kv_head_, dqkv_heads);
    Tensor dx = input_norm_.backward(
        ctx, qkv_proj_.backward(ctx, dqkv.reshape(Shape{n, heads * head_dim_})));
    be.add(dx, dx2, dx);
    gate_up_ = Tensor();
    return dx;
  }

 private:
  int64_t n_head_, n_kv_head_, head_dim_;
  RMSNorm input_norm_;
  Linear qkv_proj_, o_proj_;
  RMSNorm post_attention_norm_;
  Linear gate_up_proj_, down_proj_;
  int64_t batch_ = 0, seq_ = 0;
  CausalSelfAttention attention_;
  Tensor gate_up_;
};

Llama::Llama(const LlamaConfig& config, core::Backend& backend, const core::PrecisionPolicy& policy,
             uint64_t seed, const core::Fp8ScalingConfig& fp8, train::MasterShard shard)
    : config_(config) {
  const LlamaConfig& c = config_;
  MANTISSA_CHECK(c.n_layer > 0 && c.n_head > 0 && c.n_kv_head > 0 && c.n_embd > 0 &&
                     c.ffn_hidden > 0 && c.seq_len > 0 && c.vocab_size > 0,
                 "Llama: n_layer, n_head, n_kv_head, n_embd, ffn_hidden, seq_len and vocab_size "
                 "must be positive");
  MANTISSA_CHECK(c.n_embd % c.n_head == 0 && c.head_dim() % 2 == 0,
                 "Llama: n_embd (" << c.n_embd << ") must be n_head (" << c.n_head
                                   << ") times an even head dimension");
  MANTISSA_CHECK(c.n_head % c.n_kv_head == 0, "Llama: n_kv_head (" << c.n_kv_head
                                                                   << ") must divide n_head ("
                                                                   << c.n_head << ")");
  if (policy.fp8_block_gemms) fp8_ = std::make_unique<train::Fp8Operands>();
  embed_ = params_.add({"embed_tokens.weight", Shape{c.padded_vocab_size(), c.n_embd},
                        train::Init::kNormal, kInitStd, true});
  for (int i = 0; i < c.n_layer; ++i) {
    blocks_.push_back(std::make_unique<LlamaBlock>(params_, c, i, fp8_.get()));
  }
  norm_ = std::make_unique<RMSNorm>(params_, "norm", c.n_embd, c.norm_eps);
  lm_head_ = c.tie_embeddings
                 ? embed_
                 : params_.add({"lm_head.weight", Shape{c.padded_vocab_size(), c.n_embd},
                                train::Init::kNormal, kInitStd, true});
  head_ = std::make_unique<LMHead>(params_, lm_head_, c.vocab_size);
  params_.allocate(backend, policy.compute_dtype, seed, shard);
  // The vocabulary's padding rows start at zero and stay there, as GPT-2's (gpt2.h).
  params_.zero_from(backend, embed_, c.vocab_size * c.n_embd);
  if (lm_head_ != embed_) params_.zero_from(backend, lm_head_, c.vocab_size * c.n_embd);
  rope_table_ = core::make_rope_table(backend, c.seq_len, c.head_dim(), c.rope_theta);
  if (fp8_) fp8_->allocate(backend, fp8);
}

Llama::~Llama() = default;

Tensor Llama::forward(train::StepContext& ctx, const train::BatchTensors& batch,
                      float dloss_per_token) {
  MANTISSA_CHECK(batch.tokens.shape().rank() == 2 && batch.tokens.shape() == batch.targets.shape(),
                 "Llama.forward: tokens " << batch.tokens.describe() << " and targets "
                                          << batch.targets.describe() << " must both be [B, T]");
  Tensor losses = head_->forward(ctx, hidden(ctx, batch.tokens), batch.targets, dloss_per_token);
  batch_ = head_->has_pass() ? batch : train::BatchTensors{};
  return losses;
}

Tensor Llama::logits(train::StepContext& ctx, const Tensor& tokens) {
  Tensor out = head_->logits(ctx, hidden(ctx, tokens));
  head_->drop();  // what a training forward kept no longer matches
  return out;
}

Tensor Llama::hidden(train::StepContext& ctx, const Tensor& tokens) {
  core::Backend& be = ctx.backend;
  const int64_t b = tokens.dim(0), t = tokens.dim(1), channels = config_.n_embd;
  MANTISSA_CHECK(t <= config_.seq_len,
                 "Llama.forward: sequence length " << t << " exceeds seq_len " << config_.seq_len);
  Tensor x = Tensor::empty(Shape{b, t, channels}, ctx.policy.compute_dtype, be.device());
  be.embedding_forward(tokens, params_[embed_].compute, Tensor(), x);
  Tensor residual = x.reshape(Shape{b * t, channels});
  for (auto& block : blocks_) residual = block->forward(ctx, residual, rope_table_, b, t);
  return norm_->forward(ctx, residual);
}

void Llama::backward(train::StepContext& ctx) {
  MANTISSA_CHECK(head_->has_pass(), "Llama.backward: no training forward pass to differentiate");
  core::Backend& be = ctx.backend;
  const int64_t b = batch_.tokens.dim(0), t = batch_.tokens.dim(1);

  Tensor dresidual = head_->backward(ctx);
  if (lm_head_ != embed_) ctx.mark_grad_ready(lm_head_);
  dresidual = norm_->backward(ctx, dresidual);
  for (auto it = blocks_.rbegin(); it != blocks_.rend(); ++it) {
    dresidual = (*it)->backward(ctx, dresidual, rope_table_);
  }
  Tensor no_positions;
  be.embedding_backward(dresidual.reshape(Shape{b, t, config_.n_embd}), batch_.tokens,
                        params_[embed_].grad, no_positions);
  ctx.mark_grad_ready(embed_);
  batch_ = train::BatchTensors{};
}

int64_t Llama::parameter_count() const {
  const int64_t padding_rows = config_.padded_vocab_size() - config_.vocab_size;
  const int64_t tables = config_.tie_embeddings ? 1 : 2;
  return params_.parameter_count() - tables * padding_rows * config_.n_embd;
}

double Llama::flops_per_token() const {
  // The parameters of matrix products: tied, the one table is the output projection (as GPT-2
  // counts it, gpt2.cpp, llm.c's convention); untied, the input table is a lookup that computes
  // nothing, left out as torchtitan leaves it out (it would overstate MFU by its share of the
  // parameters, 6% in Llama 3 8B).
  const int64_t lookup = config_.tie_embeddings ? 0 : config_.vocab_size * config_.n_embd;
  return train::transformer_flops_per_token(parameter_count() - lookup, config_.n_layer,
                                            config_.n_embd, config_.seq_len);
}

}  // namespace mantissa::models
