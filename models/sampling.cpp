#include "models/sampling.h"

#include <algorithm>
#include <cmath>

#include "core/dtype/dtype.h"
#include "core/error.h"

namespace mantissa::models {

TokenSampler::TokenSampler(const SamplingOptions& options) : options_(options) {
  MANTISSA_CHECK(std::isfinite(options.temperature) && options.temperature >= 0.0,
                 "sampling: the temperature must be finite and >= 0, got " << options.temperature);
  MANTISSA_CHECK(options.top_k >= 0, "sampling: top_k must be >= 0, got " << options.top_k);
  MANTISSA_CHECK(options.top_p > 0.0 && options.top_p <= 1.0,
                 "sampling: top_p must lie in (0, 1], got " << options.top_p);
}

int32_t TokenSampler::next(std::span<const float> logits) {
  MANTISSA_CHECK(!logits.empty(), "sampling: no logits to choose from");
  const auto n = static_cast<int32_t>(logits.size());
  for (int32_t i = 0; i < n; ++i) {
    MANTISSA_REQUIRE(
        std::isfinite(logits[i]), kFailure,
        "sampling: logit " << i << " is " << logits[i] << " (the weights are not finite)");
  }
  if (std::ssize(excluded_) != n) {
    excluded_.assign(static_cast<size_t>(n), 0);
    for (const int32_t id : options_.excluded) {
      if (id >= 0 && id < n) excluded_[static_cast<size_t>(id)] = 1;
    }
  }
  // The ids drawn from, in id order.
  candidates_.clear();
  for (int32_t i = 0; i < n; ++i) {
    if (!excluded_[static_cast<size_t>(i)]) candidates_.push_back(i);
  }
  MANTISSA_CHECK(!candidates_.empty(), "sampling: every one of the " << n << " ids is excluded");
  // A strict order, more likely first and the lower id among equals, so that neither argmax
  // nor top-k depends on how a sort treats ties.
  const auto before = [&](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (options_.temperature == 0.0) {
    return *std::min_element(candidates_.begin(), candidates_.end(), before);
  }

  size_t sorted = 0;  // candidates_[0, sorted) are the most likely, in order
  if (options_.top_k > 0 && options_.top_k < std::ssize(candidates_)) {
    const auto k = static_cast<ptrdiff_t>(options_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + k, candidates_.end(), before);
    candidates_.resize(static_cast<size_t>(k));
    sorted = candidates_.size();
  }
  // softmax(z / T) over the candidates, unnormalised: exp((z - max) / T) in [0, 1], in double,
  // max the largest logit of a candidate (the most likely one is among them).
  const double max_logit =
      logits[*std::min_element(candidates_.begin(), candidates_.end(), before)];
  const auto weight = [&](int32_t id) {
    return std::exp((logits[static_cast<size_t>(id)] - max_logit) / options_.temperature);
  };
  if (options_.top_p < 1.0) {
    // The shortest run of most likely candidates that reaches top_p of the probability. It is
    // usually far shorter than the vocabulary, so the candidates are ordered a prefix at a
    // time, twice as long each time it falls short, instead of all of them.
    double all = 0.0;
    for (const int32_t c : candidates_) all += weight(c);
    const double needed = options_.top_p * all;
    double reached = 0.0;
    size_t count = 0;
    for (;;) {
      while (count < sorted && reached < needed) reached += weight(candidates_[count++]);
      if (reached >= needed || count == candidates_.size()) break;
      const size_t longer = std::min(candidates_.size(), std::max<size_t>(64, 2 * sorted));
      std::partial_sort(candidates_.begin() + static_cast<ptrdiff_t>(sorted),
                        candidates_.begin() + static_cast<ptrdiff_t>(longer), candidates_.end(),
                        before);
      sorted = longer;
    }
    candidates_.resize(count);
  }
  weights_.resize(candidates_.size());
  double total = 0.0;
  for (size_t j = 0; j < candidates_.size(); ++j) total += weights_[j] = weight(candidates_[j]);
  // u uniform in (0, 1), from 32 random bits; the first candidate whose cumulative weight
  // passes u * total is the draw (the most likely one always has weight 1, so total >= 1).
  const double u =
      (static_cast<double>(core::random_u32(options_.seed, draws_++)) + 0.5) / 4294967296.0;
  const double target = u * total;
  double cumulative = 0.0;
  size_t last_positive = 0;
  for (size_t j = 0; j < candidates_.size(); ++j) {
    if (weights_[j] == 0.0) continue;
    cumulative += weights_[j];
    last_positive = j;
    if (target < cumulative) return candidates_[j];
  }
  return candidates_[last_positive];  // u * total rounded above the sum
}

}  // namespace mantissa::models
