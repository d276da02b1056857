// What the training step needs from a model: its parameters, a forward pass that computes
// the loss (and prepares its gradient), and a backward pass into the flat gradient buffer.
#pragma once

#include "core/tensor/tensor.h"
#include "train/data/data_loader.h"
#include "train/parameters.h"
#include "train/step_context.h"

namespace mantissa::train {

class Fp8Operands;

// One rank's share of a global batch, on the backend's device: tokens and the next-token
// targets, both I32 [B, T].
struct BatchTensors {
  core::Tensor tokens;
  core::Tensor targets;
};

// A host batch copied to the backend's device.
BatchTensors upload(const Batch& batch, core::Backend& backend);

// The mean of forward()'s token losses, summed in FP64 on the host in row order (one host
// synchronisation).
double mean_loss(core::Backend& backend, const core::Tensor& token_losses);

// Training FLOPs per token of a decoder-only transformer whose matrix products hold `parameters`
// parameters (llm.c's estimate, which MFU counts; an untied input embedding or a position table, a
// lookup, is no such parameter): 6 per parameter (2 forward, 4 backward) plus 6 L C T for the
// attention score and value products, which have no parameters. PaLM and nanoGPT count 12 L C T,
// the full T x T products, where the causal mask leaves half of them to compute.
double transformer_flops_per_token(int64_t parameters, int64_t n_layer, int64_t n_embd,
                                   int64_t seq_len);

class LanguageModel {
 public:
  virtual ~LanguageModel() = default;

  virtual ParameterStore& parameters() = 0;
  // The FP8 operand scaling of this model, or nullptr when it has no FP8 GEMMs.
  virtual Fp8Operands* fp8_operands() = 0;

  // The next-token cross-entropy of every token of the batch: F32 [B*T] on the backend's
  // device, row b*T + t. Nothing is read back: the caller copies the losses to the host with
  // its other scalars, at one synchronisation (mean_loss() below when there are none).
  // With dloss_per_token > 0 the pass also keeps what backward needs, with the gradient of
  // each token's loss set to dloss_per_token (the caller folds 1/tokens, gradient
  // accumulation and the loss scale into it).
  virtual core::Tensor forward(StepContext& ctx, const BatchTensors& batch,
                               float dloss_per_token) = 0;
  // Accumulates (+=) this batch's gradients into parameters().grads().
  virtual void backward(StepContext& ctx) = 0;

  // The next-token logits of every position of `tokens` (I32 [B, T] on the backend's device,
  // T <= the model's seq_len): F32 [B*T, Vp] on the device, row b*T + t for token t of
  // sequence b, Vp the model's padded vocabulary (GPT-2's and Llama's padded_vocab_size(), the
  // MLP's vocab_size); the columns past vocab_size belong to the padding and mean nothing.
  // Exactly the logits forward() computes its loss from (the same operations; widened to F32
  // where the model's head computes in another dtype). Forward only: nothing is kept for a
  // backward pass, and a backward after it is refused.
  virtual core::Tensor logits(StepContext& ctx, const core::Tensor& tokens) = 0;

  // The model's own parameters: the store's, less any padding it carries for the hardware
  // (GPT-2's vocabulary rows past vocab_size).
  virtual int64_t parameter_count() const = 0;
  // Training FLOPs per token (forward + backward), for MFU.
  virtual double flops_per_token() const = 0;
};

}  // namespace mantissa::train
