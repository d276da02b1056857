// Held-out evaluation: the mean next-token loss of the model over a fixed validation set.
//
// The validation windows are the first whole windows of T + 1 tokens of the validation corpus,
// laid end to end (window w holds inputs at tokens [w*T, w*T + T) of its segment and the
// targets one further; windows never cross a segment), as many as eval_tokens / T. So every
// evaluation reads the same tokens, whatever the step, the seed or the world size, and curves
// of different runs compare. The windows are cut into one contiguous slice per rank; each rank
// sums the losses of its tokens, and the caller adds the sums over ranks (one all-reduce) and
// divides by tokens(): the same mean, within rounding, on any number of ranks.
//
// Some models take only a multiple of a few tokens per forward pass (token_multiple: 8 where
// FP8 GEMMs scale their inputs in 1x128 tiles, core::scale_rows_multiple's rule for the rows of
// such operands). The windows then go in groups whose tokens are such a multiple (4 windows of
// 6 tokens for 8), and everything that cuts them (the count, the ranks' slices, the
// micro-batches) cuts whole groups.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>

#include "core/error.h"
#include "core/ops/backend.h"
#include "core/precision/policy.h"
#include "train/data/corpus.h"
#include "train/language_model.h"

namespace mantissa::train {

// A validation set too small to evaluate: no whole window of seq_len + 1 tokens, or fewer than
// one group of them (the settings that hold out more fix it, which they would not for bad data).
class ValidationTooSmall : public core::ConfigError {
 public:
  using core::ConfigError::ConfigError;
};

class Evaluator {
 public:
  // Throws ValidationTooSmall, or core::ConfigError when one of this rank's windows holds a
  // token past the corpus's vocabulary (they are read once here).
  Evaluator(std::shared_ptr<const Corpus> corpus, int64_t seq_len, int64_t eval_tokens,
            int64_t micro_batch, int world_size, int rank, int64_t token_multiple = 1);

  // Called after each micro-batch is queued, with the micro-batches done and micro_batches():
  // as often on every rank (a rank with fewer windows is called for the micro-batches it does
  // not have too, with no forward pass), so that it may hold a collective. Returning false
  // abandons the evaluation; every rank must return the same. A long evaluation shows its
  // progress through it, and a stop asked for meanwhile need not wait for the rest.
  using Progress = std::function<bool(int64_t done, int64_t total)>;

  // The sum over this rank's validation tokens of the model's loss (a forward pass only, in
  // micro-batches of up to micro_batch windows, whole groups); std::nullopt when `progress`
  // abandoned it.
  std::optional<double> local_loss_sum(LanguageModel& model, core::Backend& backend,
                                       const core::PrecisionPolicy& policy,
                                       const Progress& progress = {}) const;
  // Validation tokens of one evaluation, all ranks together.
  int64_t tokens() const { return windows_ * seq_len_; }
  // The tokens of every whole window the validation set holds; the multiple of tokens a
  // forward pass takes, and the windows of a group, the fewest whose tokens are such a
  // multiple. tokens() is the fewer of eval_tokens and the available ones, cut to whole groups
  // (one group at least, which may be more than eval_tokens).
  int64_t available_tokens() const { return available_windows_ * seq_len_; }
  int64_t group_windows() const { return token_multiple_ / std::gcd(seq_len_, token_multiple_); }
  int64_t token_multiple() const { return token_multiple_; }
  // Micro-batches of one evaluation on the rank with the most windows.
  int64_t micro_batches() const { return micro_batches_; }

 private:
  // Fills tokens and targets of `count` windows starting at window `first`.
  void read_windows(int64_t first, int64_t count, std::vector<int32_t>& tokens,
                    std::vector<int32_t>& targets) const;

  std::shared_ptr<const Corpus> corpus_;
  int64_t seq_len_;
  int64_t micro_batch_;            // whole groups
  int64_t available_windows_ = 0;  // in the whole validation set
  int64_t token_multiple_;
  int64_t windows_ = 0;       // all ranks together
  int64_t first_window_ = 0;  // this rank's slice [first_window_, end_window_)
  int64_t end_window_ = 0;
  int64_t micro_batches_ = 0;
};

}  // namespace mantissa::train
