// Text generation with the KV cache against its anchor, re-running the whole window for every
// token (nanoGPT's sample.py without a cache), in the same run on the same model.
//
//   bench_sample [n_layer n_head n_embd seq_len vocab new_tokens [cpu|cuda]]
//
// Both generate new_tokens greedily after a one-token prompt, in FP32 with random weights.
// The cached path is models::generate (its window slides once full, see models/decoder.h); the
// anchor feeds the last seq_len tokens through the full forward each time and keeps the last
// row's logits. Then the cost of one cached step at a few cache lengths: it may grow with the
// length only by the attention term, which is small next to the weights' GEMMs.
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_main.h"
#include "core/ops/backend.h"
#include "core/ops/cpu_switches.h"
#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_decoder.h"
#include "models/sampling.h"

using namespace mantissa;
using core::Shape;
using core::Tensor;

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The anchor: every token from the full forward over the last seq_len tokens.
std::vector<int32_t> generate_without_cache(models::GPT2Decoder& decoder,
                                            std::vector<int32_t> context, int64_t new_tokens) {
  core::Backend& be = decoder.backend();
  models::TokenSampler greedy(models::SamplingOptions{0.0, 0, 0});
  const int64_t vocab = decoder.vocab_size();
  std::vector<float> host(static_cast<size_t>(vocab));
  Tensor host_row = Tensor::wrap(host.data(), Shape{vocab}, core::DType::kF32);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < new_tokens; ++i) {
    const int64_t n = std::min<int64_t>(decoder.capacity(), std::ssize(context));
    const Tensor logits = decoder.full_logits(std::span(context).last(static_cast<size_t>(n)));
    be.copy(logits.view((n - 1) * vocab, Shape{vocab}), host_row);
    be.synchronize();
    out.push_back(greedy.next(host));
    context.push_back(out.back());
  }
  return out;
}

// Seconds of one cached step with `length` positions already in the cache (median of 5).
double step_seconds(models::GPT2Decoder& decoder, int64_t length) {
  std::vector<int32_t> prompt(static_cast<size_t>(length), 1);
  std::vector<double> times;
  for (int r = 0; r < 5; ++r) {
    decoder.clear();
    if (length > 0) decoder.append(prompt);
    decoder.backend().synchronize();
    const auto start = std::chrono::steady_clock::now();
    const int32_t token = 2;
    decoder.append(std::span<const int32_t>(&token, 1));
    decoder.backend().synchronize();
    times.push_back(seconds_since(start));
  }
  std::sort(times.begin(), times.end());
  return times[2];
}

}  // namespace

static int benchmark_main(int argc, char** argv) {
  const bench::Arguments args(argc, argv,
                              "bench_sample [n_layer n_head n_embd seq_len vocab new_tokens "
                              "[cpu|cuda]] (each >= 1, n_embd a multiple of n_head, vocab >= 3)");
  args.expect_count_in({0, 6, 7});
  // vocab >= 3: the prompt is token 1, and step_seconds appends token 2.
  const models::GPT2Config config{args.whole<int64_t>(1, 6, 1), args.whole<int64_t>(2, 6, 1),
                                  args.whole<int64_t>(3, 384, 1), args.whole<int64_t>(4, 256, 1),
                                  args.whole<int64_t>(5, 256, 3)};
  const int64_t new_tokens = args.whole<int64_t>(6, 320, 1);
  if (config.n_embd % config.n_head != 0) args.fail();
  const bool cuda = args.word(7, "cpu", {"cpu", "cuda"}) == "cuda";
  std::unique_ptr<core::Backend> backend =
      cuda ? core::make_cuda_backend(0) : core::make_cpu_backend();
  const std::string device =
      cuda ? "CUDA" : "CPU (" + std::to_string(omp_get_max_threads()) + " threads)";
  if (!cuda) std::printf("%s\n", core::cpu_paths_description().c_str());

  models::GPT2 model(config, *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32),
                     1);
  models::GPT2Decoder decoder(model, *backend);
  std::printf(
      "GPT-2 n_layer %lld, n_head %lld, n_embd %lld, seq_len %lld, vocab %lld, FP32 on %s: "
      "%lld new tokens after a 1-token prompt, greedy\n",
      static_cast<long long>(config.n_layer), static_cast<long long>(config.n_head),
      static_cast<long long>(config.n_embd), static_cast<long long>(config.seq_len),
      static_cast<long long>(config.vocab_size), device.c_str(),
      static_cast<long long>(new_tokens));

  const std::vector<int32_t> prompt = {1};
  models::TokenSampler greedy(models::SamplingOptions{0.0, 0, 0});
  models::generate(decoder, prompt, 8, greedy, config.vocab_size);  // warm-up
  auto start = std::chrono::steady_clock::now();
  const std::vector<int32_t> cached =
      models::generate(decoder, prompt, new_tokens, greedy, config.vocab_size);
  const double cached_s = seconds_since(start);

  generate_without_cache(decoder, prompt, 2);  // warm-up
  start = std::chrono::steady_clock::now();
  const std::vector<int32_t> anchor = generate_without_cache(decoder, prompt, new_tokens);
  const double anchor_s = seconds_since(start);

  const auto rate = [&](double s) { return static_cast<double>(new_tokens) / s; };
  std::printf("  KV cache:                   %9.1f tokens/s\n", rate(cached_s));
  std::printf("  anchor, whole window again: %9.1f tokens/s   (cache %.1fx faster)\n",
              rate(anchor_s), anchor_s / cached_s);
  // The two agree until the cached window first slides: then the cache keeps seq_len / 2
  // tokens of context where the anchor keeps seq_len.
  const int64_t same = std::min<int64_t>(new_tokens, config.seq_len);
  const bool agree = std::equal(cached.begin(), cached.begin() + same, anchor.begin());
  std::printf("  the first %lld tokens %s\n", static_cast<long long>(same),
              agree ? "are the same on both paths" : "DIFFER between the paths");

  std::printf("  one cached step at cache length:");
  for (const int64_t length :
       {int64_t{0}, config.seq_len / 4, config.seq_len / 2, config.seq_len - 1}) {
    std::printf("  %lld: %.3f ms", static_cast<long long>(length),
                1e3 * step_seconds(decoder, length));
  }
  std::printf("\n");
  return agree ? 0 : 1;
}

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_sample",
                                         [&] { return benchmark_main(argc, argv); });
}
