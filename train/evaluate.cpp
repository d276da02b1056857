#include "train/evaluate.h"

#include <algorithm>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/int_math.h"
#include "train/step_context.h"

namespace mantissa::train {

using core::DType;
using core::Shape;
using core::Tensor;

namespace {

// Whole windows of seq_len + 1 tokens, laid end to end with a stride of seq_len, in a segment.
int64_t windows_in(const TokenSegment& segment, int64_t seq_len) {
  const int64_t n = segment.size();
  return n > seq_len ? (n - 1) / seq_len : 0;
}

}  // namespace

Evaluator::Evaluator(std::shared_ptr<const Corpus> corpus, int64_t seq_len, int64_t eval_tokens,
                     int64_t micro_batch, int world_size, int rank, int64_t token_multiple)
    : corpus_(std::move(corpus)), seq_len_(seq_len), token_multiple_(token_multiple) {
  for (const TokenSegment& s : corpus_->segments()) available_windows_ += windows_in(s, seq_len_);
  const int64_t available = available_windows_;
  const std::string holds = "validation set " + corpus_->name() + ": " +
                            std::to_string(corpus_->num_tokens()) + " tokens hold ";
  const std::string of_tokens = " of seq_len + 1 = " + std::to_string(seq_len_ + 1) + " tokens";
  if (available == 0) throw ValidationTooSmall(holds + "no whole window" + of_tokens);
  const int64_t group = group_windows();
  if (available < group) {
    throw ValidationTooSmall(
        holds + std::to_string(available) + " whole window" + (available == 1 ? "" : "s") +
        of_tokens + ", and this model evaluates them in groups of " + std::to_string(group) +
        " (every forward pass takes a multiple of " + std::to_string(token_multiple) + " tokens)");
  }
  const int64_t groups = std::min(available, std::max<int64_t>(1, eval_tokens / seq_len_)) / group;
  windows_ = std::max<int64_t>(1, groups) * group;
  first_window_ = windows_ / group * rank / world_size * group;
  end_window_ = windows_ / group * (rank + 1) / world_size * group;
  micro_batch_ = std::max<int64_t>(1, micro_batch / group) * group;
  // The ranks' slices differ by one group at most; the largest holds ceil(groups / ranks).
  micro_batches_ =
      core::ceil_div(core::ceil_div(windows_ / group, int64_t{world_size}) * group, micro_batch_);
  // Each window of this rank's slice is read once now: a token past the vocabulary stops the
  // start, not the first evaluation (eval_every steps in, maybe before any checkpoint).
  std::vector<int32_t> tokens, targets;
  for (int64_t first = first_window_; first < end_window_; first += micro_batch_) {
    read_windows(first, std::min(micro_batch_, end_window_ - first), tokens, targets);
  }
}

void Evaluator::read_windows(int64_t first, int64_t count, std::vector<int32_t>& tokens,
                             std::vector<int32_t>& targets) const {
  tokens.resize(static_cast<size_t>(count * seq_len_));
  targets.resize(tokens.size());
  int64_t w = 0;  // windows of the segments before `segment`
  int64_t filled = 0;
  for (const TokenSegment& segment : corpus_->segments()) {
    const int64_t here = windows_in(segment, seq_len_);
    for (int64_t k = std::max(first, w); k < std::min(first + count, w + here); ++k, ++filled) {
      const int64_t start = (k - w) * seq_len_;
      const auto in = std::span(tokens).subspan(filled * seq_len_, seq_len_);
      const auto out = std::span(targets).subspan(filled * seq_len_, seq_len_);
      segment.read(start, in, corpus_->vocab_size());
      segment.read(start + 1, out, corpus_->vocab_size());
    }
    w += here;
    if (w >= first + count) break;
  }
}

std::optional<double> Evaluator::local_loss_sum(LanguageModel& model, core::Backend& backend,
                                                const core::PrecisionPolicy& policy,
                                                const Progress& progress) const {
  StepContext ctx{backend, policy, model.fp8_operands(), {}};
  // Every token's loss stays on the device until one copy after the last micro-batch: a read
  // per micro-batch would make the host wait for each forward.
  const int64_t tokens = (end_window_ - first_window_) * seq_len_;
  Tensor losses;
  if (tokens > 0) losses = Tensor::empty(Shape{tokens}, DType::kF32, backend.device());
  Batch batch;
  batch.seq_len = seq_len_;
  for (int64_t i = 0; i < micro_batches_; ++i) {
    const int64_t first = first_window_ + i * micro_batch_;
    if (first < end_window_) {
      batch.batch_size = std::min(micro_batch_, end_window_ - first);
      read_windows(first, batch.batch_size, batch.tokens, batch.targets);
      // dloss_per_token 0: the forward keeps nothing for a backward pass.
      const Tensor batch_losses = model.forward(ctx, upload(batch, backend), 0.0f);
      Tensor slot = losses.view((first - first_window_) * seq_len_, Shape{batch_losses.numel()});
      backend.copy(batch_losses, slot);
    }
    if (progress && !progress(i + 1, micro_batches_)) return std::nullopt;
  }
  if (tokens == 0) return 0.0;
  Tensor host = Tensor::empty(Shape{tokens}, DType::kF32);
  backend.copy(losses, host);
  backend.synchronize();
  const float* loss = host.data_as<float>();
  double sum = 0.0;
  for (int64_t i = 0; i < tokens; ++i) sum += loss[i];
  return sum;
}

}  // namespace mantissa::train
