#include "models/decoder.h"

#include <algorithm>

#include "core/error.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

std::vector<int32_t> generate(Decoder& decoder, std::span<const int32_t> prompt,
                              int64_t max_new_tokens, TokenSampler& sampler, int64_t vocab_limit) {
  MANTISSA_CHECK(!prompt.empty(), "generate: the prompt needs at least one token");
  MANTISSA_CHECK(
      vocab_limit >= 1 && vocab_limit <= decoder.vocab_size(),
      "generate: vocab_limit " << vocab_limit << " outside [1, " << decoder.vocab_size() << "]");
  std::vector<int32_t> generated;
  if (max_new_tokens <= 0) return generated;
  const int64_t window = decoder.capacity();
  const int64_t keep = std::max<int64_t>(1, window / 2);
  // The tokens in the cache, at positions 0, 1, ...
  std::vector<int32_t> context(prompt.end() - std::min<int64_t>(window, std::ssize(prompt)),
                               prompt.end());
  decoder.clear();
  Tensor logits = decoder.append(context);

  core::Backend& be = decoder.backend();
  std::vector<float> host(static_cast<size_t>(vocab_limit));
  Tensor host_logits = Tensor::wrap(host.data(), Shape{vocab_limit}, DType::kF32);
  generated.reserve(static_cast<size_t>(max_new_tokens));
  while (true) {
    be.copy(logits.view(0, Shape{vocab_limit}), host_logits);
    be.synchronize();
    const int32_t token = sampler.next(host);
    generated.push_back(token);
    if (std::ssize(generated) == max_new_tokens) break;
    if (decoder.length() < window) {
      context.push_back(token);
      logits = decoder.append(std::span<const int32_t>(&token, 1));
    } else {
      // The window slides: the last keep - 1 tokens and the new one, from position 0.
      context.erase(context.begin(), context.end() - (keep - 1));
      context.push_back(token);
      decoder.clear();
      logits = decoder.append(context);
    }
  }
  return generated;
}

}  // namespace mantissa::models
