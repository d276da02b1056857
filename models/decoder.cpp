#include "models/decoder.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"

namespace mantissa::models {

using core::DType;
using core::Shape;
using core::Tensor;

Decoder::Decoder(const char* name, core::Backend& backend, DType dtype, int64_t capacity,
                 int64_t vocab_size)
    : name_(name), backend_(backend), dtype_(dtype), capacity_(capacity), vocab_size_(vocab_size) {}

Tensor Decoder::append(std::span<const int32_t> tokens) {
  return forward(tokens, true);
}

Tensor Decoder::full_logits(std::span<const int32_t> tokens) {
  return forward(tokens, false);
}

Tensor Decoder::forward(std::span<const int32_t> tokens, bool cached) {
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t start = cached ? length_ : 0;
  MANTISSA_CHECK(n > 0 && start + n <= capacity_,
                 name_ << ": " << n << " tokens at position " << start
                       << " do not fit the window of seq_len " << capacity_
                       << " (at least one token, and no position past the last)");
  Tensor host_tokens = Tensor::empty(Shape{1, n}, DType::kI32);
  std::memcpy(host_tokens.data(), tokens.data(), tokens.size_bytes());
  Tensor device_tokens = host_tokens;
  if (!backend_.device().is_cpu()) {
    device_tokens = Tensor::empty(host_tokens.shape(), DType::kI32, backend_.device());
    backend_.copy(host_tokens, device_tokens);
  }
  const Tensor hidden = final_hidden(device_tokens, start, cached);
  Tensor logits = Tensor::empty(Shape{hidden.dim(0), vocab_size_}, DType::kF32, backend_.device());
  core::GemmParams p;
  p.trans_b = true;
  backend_.gemm(hidden, head(), logits, p);
  if (!cached) return logits;
  length_ += n;
  return logits.reshape(Shape{vocab_size_});
}

Tensor Decoder::linear(const Tensor& x, const Tensor& weight) {
  Tensor y = Tensor::empty(Shape{x.dim(0), weight.dim(0)}, dtype_, backend_.device());
  core::GemmParams p;
  p.trans_b = true;
  backend_.gemm(x, weight, y, p);
  return y;
}

Tensor Decoder::attend(const Tensor& qkv, Tensor& k_cache, Tensor& v_cache, int64_t n_head,
                       int64_t start, bool cached) {
  const int64_t n = qkv.dim(0), C = qkv.dim(1) / 3;
  Tensor attended = Tensor::empty(Shape{n, C}, dtype_, backend_.device());
  if (cached) {
    backend_.attention_decode(qkv, k_cache, v_cache, attended, static_cast<int>(n_head), start);
  } else {
    Tensor att = Tensor::empty(Shape{1, n_head, n, n}, DType::kF32, backend_.device());
    Tensor out = attended.reshape(Shape{1, n, C});
    backend_.attention_forward(qkv.reshape(Shape{1, n, 3 * C}), out, att, static_cast<int>(n_head));
  }
  return attended;
}

std::vector<int32_t> generate(Decoder& decoder, std::span<const int32_t> prompt,
                              int64_t max_new_tokens, TokenSampler& sampler, int64_t vocab_limit,
                              const std::function<void(int32_t)>& on_token, int32_t stop_token) {
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
  generated.reserve(static_cast<size_t>(std::min<int64_t>(max_new_tokens, int64_t{1} << 16)));
  while (true) {
    be.copy(logits.view(0, Shape{vocab_limit}), host_logits);
    be.synchronize();
    const int32_t token = sampler.next(host);
    generated.push_back(token);
    if (on_token) on_token(token);
    if (std::ssize(generated) == max_new_tokens || token == stop_token) break;
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
