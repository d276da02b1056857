// Every parameter gradient of a tiny GPT-2 (and of the MLP) against central finite
// differences of the loss, in FP32.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "core/ops/backend.h"
#include "models/gpt2/gpt2.h"
#include "models/mlp/mlp.h"

namespace mantissa::models {
namespace {

using core::DType;
using core::Shape;
using core::Tensor;

// Tokens and next-token targets drawn from a fixed hash, [B, T] on the CPU.
train::BatchTensors make_batch(int64_t b, int64_t t, int64_t vocab, uint64_t seed) {
  train::BatchTensors batch{Tensor::empty(Shape{b, t}, DType::kI32),
                            Tensor::empty(Shape{b, t}, DType::kI32)};
  for (int64_t i = 0; i < b * t; ++i) {
    batch.tokens.data_as<int32_t>()[i] =
        static_cast<int32_t>(core::random_u32(seed, 2 * i) % vocab);
    batch.targets.data_as<int32_t>()[i] =
        static_cast<int32_t>(core::random_u32(seed, 2 * i + 1) % vocab);
  }
  return batch;
}

// Replaces the masters with N(0, std) values: GPT-2's 0.02 initialisation makes most
// gradients too small for FP32 finite differences to resolve.
void randomise_masters(train::ParameterStore& params, core::Backend& be, float std, uint64_t seed) {
  Tensor& masters = params.masters();
  for (const train::Parameter& p : params.all()) {
    float* w = masters.data_as<float>() + p.offset;
    for (int64_t i = 0; i < p.numel(); ++i) {
      const double u1 = (core::random_u32(seed + p.offset, 2 * i) + 1.0) / 4294967297.0;
      const double u2 = core::random_u32(seed + p.offset, 2 * i + 1) / 4294967296.0;
      w[i] = static_cast<float>(std * std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307 * u2));
    }
  }
  params.refresh_compute_copy(be);
}

// Gradients here are 1e-4..1e-1; the FP32 loss resolves differences to about 1e-6 at
// eps = 1e-2, hence the tolerance. Checks up to `per_tensor` elements of every parameter tensor
// (always the first and the last, the rest spread across the tensor).
void check_gradients(train::LanguageModel& model, core::Backend& be,
                     const train::BatchTensors& batch, int per_tensor) {
  const core::PrecisionPolicy policy = core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32);
  train::StepContext ctx{be, policy, nullptr, {}};
  train::ParameterStore& params = model.parameters();
  params.zero_grad(be);
  const int64_t tokens = batch.tokens.numel();
  model.forward(ctx, batch, 1.0f / static_cast<float>(tokens));
  model.backward(ctx);
  const std::vector<float> grads(params.grads().data_as<float>(),
                                 params.grads().data_as<float>() + params.flat_numel());

  const float eps = 1e-2f;
  float* masters = params.masters().data_as<float>();
  for (const train::Parameter& p : params.all()) {
    const int64_t n = p.numel();
    const int samples = static_cast<int>(std::min<int64_t>(n, per_tensor));
    for (int s = 0; s < samples; ++s) {
      const int64_t i = p.offset + (samples == 1 ? 0 : s * (n - 1) / (samples - 1));
      const float saved = masters[i];
      masters[i] = saved + eps;
      params.refresh_compute_copy(be);
      const double up = model.forward(ctx, batch, 0.0f);
      masters[i] = saved - eps;
      params.refresh_compute_copy(be);
      const double down = model.forward(ctx, batch, 0.0f);
      masters[i] = saved;
      const double numeric = (up - down) / (2.0 * eps);
      const double analytic = grads[static_cast<size_t>(i)];
      EXPECT_NEAR(analytic, numeric, 1e-5 + 1e-3 * std::fabs(numeric))
          << p.spec.name << " element " << i - p.offset;
    }
  }
  params.refresh_compute_copy(be);
}

TEST(Gradcheck, TinyGPT2EveryParameterTensor) {
  auto be = core::make_cpu_backend();
  const GPT2Config config{2, 2, 8, 6, 13};
  GPT2 model(config, *be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 7);
  randomise_masters(model.parameters(), *be, 0.3f, 11);
  check_gradients(model, *be, make_batch(2, 5, config.vocab_size, 3), 6);
}

TEST(Gradcheck, MLPEveryParameterTensor) {
  auto be = core::make_cpu_backend();
  const MLPConfig config{6, 10, 5, 9};
  MLP model(config, *be, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 5);
  randomise_masters(model.parameters(), *be, 0.3f, 13);
  check_gradients(model, *be, make_batch(3, 4, config.vocab_size, 9), 6);
}

}  // namespace
}  // namespace mantissa::models
