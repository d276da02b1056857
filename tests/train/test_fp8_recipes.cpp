// The block FP8 recipes (BLOCKWISE, ROWWISE, MXFP8) in training, on the CPU backend:
//  - a Linear layer's three GEMMs against FP64 products of the unquantized operands, within
//    what FP8 rounding allows, with and without bias (Llama's layers have none), for the
//    per-tensor recipes too (their scales, paired with the wrong operand, miss by far);
//  - the weight's FP8 copies are made once per training step and reused by its micro-batches,
//    and made again for the next step (and outside steps);
//  - a tiny GPT-2 and a tiny Llama trained with each recipe (and with gradient accumulation)
//    keep the mean loss of the last 10% of steps within 3% of BF16's (the runs' own spread
//    is about 2%, see below; a wrong scale layout or lost gradients miss by far more);
//  - the registry keeps no history for them: newest amax only, scale 1;
//  - a step of several micro-batches records each operand's largest amax over them.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/ops/backend.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "models/nn/linear.h"
#include "train/data/corpus.h"
#include "train/data/data_loader.h"
#include "train/fp8_operands.h"
#include "train/train_loop.h"

namespace mantissa::train {
namespace {

using core::DType;
using core::Fp8Recipe;
using core::PrecisionMode;
using core::PrecisionPolicy;
using core::Shape;
using core::Tensor;

constexpr Fp8Recipe kBlockRecipes[] = {Fp8Recipe::kBlockwise, Fp8Recipe::kRowwise,
                                       Fp8Recipe::kMxfp8};

core::Fp8ScalingConfig recipe_config(Fp8Recipe recipe) {
  core::Fp8ScalingConfig c;
  c.recipe = recipe;
  c.grad_format = core::is_block_recipe(recipe) ? DType::kE4M3 : DType::kE5M2;
  c.power_of_two = recipe == Fp8Recipe::kMxfp8;
  return c;
}

std::vector<float> random_values(int64_t n, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = normal(rng);
  return v;
}

Tensor host_f32(const Shape& shape, const std::vector<float>& values) {
  Tensor t = Tensor::empty(shape, DType::kF32);
  std::memcpy(t.data(), values.data(), values.size() * sizeof(float));
  return t;
}

// ||got - want|| / ||want|| in FP64.
double relative_error(const Tensor& got, const std::vector<double>& want) {
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got.data_as<float>()[i]) - want[i];
    err += d * d;
    norm += want[i] * want[i];
  }
  return std::sqrt(err / norm);
}

// One Linear layer (F32 compute) in FP8: y = x W^T + b, dx = dy W, dW = dy^T x and db (the
// column sums of dy) against FP64. E4M3 keeps 3 mantissa bits, a relative rounding error of at
// most 2^-4 per operand element; random signs make the products' errors add like a random
// walk, so a GEMM's relative error stays near 2^-4 / sqrt(3) per operand: 6% is a loose bound
// that a wrong scale or layout (errors of order 1) cannot meet. The per-tensor recipes'
// gradients are E5M2 (2 mantissa bits): twice that, 12%. DELAYED scales from the amaxes of
// earlier steps (1 before the first, which would flush dy ~ 1e-3 to zero), so one pass runs
// first and its amaxes set the scales.
TEST(Fp8Recipes, LinearGemmsMatchFp64) {
  const int64_t n = 256, in = 384, out = 256;
  const std::vector<float> x = random_values(n * in, 1.0f, 1);
  const std::vector<float> dy = random_values(n * out, 1e-3f, 2);
  for (Fp8Recipe recipe : {Fp8Recipe::kDelayed, Fp8Recipe::kCurrent, Fp8Recipe::kBlockwise,
                           Fp8Recipe::kRowwise, Fp8Recipe::kMxfp8}) {
    const double gradient_bound = core::is_block_recipe(recipe) ? 0.06 : 0.12;
    for (bool bias : {true, false}) {
      auto be = core::make_cpu_backend();
      PrecisionPolicy policy = PrecisionPolicy::from_mode(PrecisionMode::kFP32);
      policy.fp8_block_gemms = true;
      ParameterStore store;
      Fp8Operands fp8;
      models::Linear layer(store, "l", in, out, 0.02f, &fp8, bias);
      store.allocate(*be, DType::kF32, 7);
      fp8.allocate(*be, recipe_config(recipe));
      store.zero_grad(*be);
      StepContext ctx{*be, policy, &fp8, {}, 0};
      if (recipe == Fp8Recipe::kDelayed) {
        layer.forward(ctx, host_f32(Shape{n, in}, x));
        layer.backward(ctx, host_f32(Shape{n, out}, dy));
        fp8.update_scales(*be, fp8.read_amaxes(*be));
        store.zero_grad(*be);
      }
      const Tensor y = layer.forward(ctx, host_f32(Shape{n, in}, x));
      const Tensor dx = layer.backward(ctx, host_f32(Shape{n, out}, dy));
      const float* w = store[0].compute.data_as<float>();
      std::vector<double> y64(static_cast<size_t>(n * out)), dx64(static_cast<size_t>(n * in)),
          dw64(static_cast<size_t>(out * in));
      for (int64_t r = 0; r < n; ++r) {
        for (int64_t o = 0; o < out; ++o) {
          double sum = 0.0;
          for (int64_t i = 0; i < in; ++i)
            sum += static_cast<double>(x[r * in + i]) * w[o * in + i];
          y64[r * out + o] = sum;  // the bias starts at zero
        }
        for (int64_t i = 0; i < in; ++i) {
          double sum = 0.0;
          for (int64_t o = 0; o < out; ++o)
            sum += static_cast<double>(dy[r * out + o]) * w[o * in + i];
          dx64[r * in + i] = sum;
        }
      }
      for (int64_t o = 0; o < out; ++o) {
        for (int64_t i = 0; i < in; ++i) {
          double sum = 0.0;
          for (int64_t r = 0; r < n; ++r)
            sum += static_cast<double>(dy[r * out + o]) * x[r * in + i];
          dw64[o * in + i] = sum;
        }
      }
      const char* name = core::fp8_recipe_name(recipe);
      EXPECT_LT(relative_error(y, y64), 0.06) << name << " forward";
      EXPECT_LT(relative_error(dx, dx64), gradient_bound) << name << " input gradient";
      EXPECT_LT(relative_error(store[0].grad, dw64), gradient_bound) << name << " weight gradient";
      if (bias) {
        // dy itself, not its FP8 copy: column sums in FP32.
        std::vector<double> db64(static_cast<size_t>(out), 0.0);
        for (int64_t r = 0; r < n; ++r)
          for (int64_t o = 0; o < out; ++o) db64[o] += dy[r * out + o];
        EXPECT_LT(relative_error(store[1].grad, db64), 1e-5) << name << " bias gradient";
      }
      // Not the identity either: FP8 rounding is there.
      EXPECT_GT(relative_error(y, y64), 1e-4) << name;
    }
  }
}

// Within one step every micro-batch's forward uses the FP8 copy of the weights made by the
// first; the next step, and a pass outside training steps, quantize the weights again.
TEST(Fp8Recipes, WeightCopiesAreMadeOncePerStep) {
  auto be = core::make_cpu_backend();
  PrecisionPolicy policy = PrecisionPolicy::from_mode(PrecisionMode::kFP32);
  policy.fp8_block_gemms = true;
  ParameterStore store;
  Fp8Operands fp8;
  models::Linear layer(store, "l", 128, 128, 0.02f, &fp8, false);
  store.allocate(*be, DType::kF32, 3);
  fp8.allocate(*be, recipe_config(Fp8Recipe::kBlockwise));
  const Tensor x = host_f32(Shape{128, 128}, random_values(128 * 128, 1.0f, 4));
  const auto forward = [&](int64_t step) {
    StepContext ctx{*be, policy, &fp8, {}, step};
    const Tensor y = layer.forward(ctx, x);
    std::vector<float> out(static_cast<size_t>(y.numel()));
    std::memcpy(out.data(), y.data(), y.nbytes());
    return out;
  };
  const std::vector<float> before = forward(5);
  float* w = store[0].compute.data_as<float>();
  for (int64_t i = 0; i < store[0].compute.numel(); ++i) w[i] *= 2.0f;
  EXPECT_EQ(forward(5), before) << "the same step reuses its weight copy";
  const std::vector<float> next = forward(6);
  EXPECT_NE(next, before) << "the next step quantizes the changed weights";
  for (int64_t i = 0; i < store[0].compute.numel(); ++i) w[i] *= 0.5f;
  EXPECT_EQ(forward(-1), before) << "outside a step the weights are quantized afresh";
}

TEST(Fp8Recipes, RegistryKeepsNoHistory) {
  core::Fp8ScalingRegistry registry(recipe_config(Fp8Recipe::kBlockwise));
  registry.add("x", DType::kE4M3);
  EXPECT_EQ(registry.history_len(), 1);
  registry.update(std::vector<float>{3.0f});
  registry.update(std::vector<float>{2.0f});
  EXPECT_EQ(registry.newest_amax(0), 2.0f);
  EXPECT_EQ(registry.tensor(0).scale, 1.0f);
  EXPECT_EQ(registry.state().recipe, "BLOCKWISE");
  core::Fp8ScalingRegistry delayed(core::Fp8ScalingConfig{});
  delayed.add("x", DType::kE4M3);
  EXPECT_THROW(registry.set_state(delayed.state()), core::Error);
}

// ---------------------------------------------------------------------------------------
// Training.

std::shared_ptr<const Corpus> corpus() {
  static auto c = std::make_shared<const Corpus>(Corpus::synthetic(1, 1 << 18));
  return c;
}

template <class Model, class ModelConfig>
double train_tiny(const ModelConfig& model_config, PrecisionMode mode,
                  const core::Fp8ScalingConfig& fp8, int64_t accum) {
  auto be = core::make_cpu_backend();
  const PrecisionPolicy policy = PrecisionPolicy::from_mode(mode);
  Model model(model_config, *be, policy, 42, fp8);
  DataLoaderConfig data;
  data.seq_len = model_config.seq_len;
  data.micro_batch = 8 / accum;
  data.seed = 5;
  DataLoader loader(corpus(), data);
  TrainLoopConfig config;
  config.steps = 150;
  config.grad_accum_steps = accum;
  config.lr.lr = 3e-3;
  config.lr.warmup_steps = 15;
  config.lr.min_lr_ratio = 0.1;
  config.adamw.weight_decay = 0.0f;
  config.loss_scale.mode = core::LossScaleMode::kNone;
  const std::vector<StepReport> reports = train_single_rank(model, *be, policy, loader, config);
  EXPECT_LT(reports.back().loss, reports.front().loss - 1.0) << "did not learn";
  double sum = 0.0;
  const size_t last = reports.size() / 10;
  for (size_t i = reports.size() - last; i < reports.size(); ++i) sum += reports[i].loss;
  return sum / static_cast<double>(last);
}

// The newest amax of every FP8 operand after `steps` steps of `accum` micro-batches, at lr 0
// (the weights stay as they are).
std::vector<float> amaxes_after(const core::Fp8ScalingConfig& fp8, int64_t steps, int64_t accum,
                                std::vector<std::string>* names = nullptr) {
  auto be = core::make_cpu_backend();
  const PrecisionPolicy policy = PrecisionPolicy::from_mode(PrecisionMode::kFP8Hybrid);
  const models::GPT2Config model_config{2, 2, 128, 64, 256};
  models::GPT2 model(model_config, *be, policy, 42, fp8);
  DataLoaderConfig data;
  data.seq_len = model_config.seq_len;
  data.micro_batch = 2;
  data.seed = 5;
  DataLoader loader(corpus(), data);
  TrainLoopConfig config;
  config.steps = steps;
  config.grad_accum_steps = accum;
  config.lr.lr = 0.0;
  config.adamw.weight_decay = 0.0f;
  config.loss_scale.mode = core::LossScaleMode::kNone;
  train_single_rank(model, *be, policy, loader, config);
  const core::Fp8ScalingRegistry& registry = model.fp8_operands()->registry();
  std::vector<float> amaxes;
  for (int i = 0; i < registry.size(); ++i) {
    amaxes.push_back(registry.newest_amax(i));
    if (names) names->push_back(registry.tensor(i).name);
  }
  return amaxes;
}

// A step of two micro-batches records, for every operand, the larger amax of the two, as the
// steps of one micro-batch each see them (Transformer Engine's rule). Only the last
// micro-batch's counted before, so an outlier in the others never reached a DELAYED scale.
// CURRENT scales each use by its own amax, so both runs quantize alike; the inputs and weights
// compare (the gradients of a two-micro-batch step are half as large: per token of the step).
TEST(Fp8Recipes, AStepsAmaxIsTheLargestOfItsMicroBatches) {
  core::Fp8ScalingConfig fp8;
  fp8.recipe = Fp8Recipe::kCurrent;
  std::vector<std::string> names;
  const std::vector<float> first = amaxes_after(fp8, 1, 1, &names);
  const std::vector<float> second = amaxes_after(fp8, 2, 1);
  const std::vector<float> both = amaxes_after(fp8, 1, 2);
  int differ = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].ends_with(".grad_output")) continue;
    EXPECT_EQ(both[i], std::max(first[i], second[i])) << names[i];
    differ += first[i] != second[i];
  }
  EXPECT_GT(differ, 0) << "the micro-batches must differ for the test to tell";
}

template <class Model, class ModelConfig>
void expect_recipes_track_bf16(const char* name, const ModelConfig& model_config) {
  const double bf16 = train_tiny<Model>(model_config, PrecisionMode::kBF16, {}, 1);
  // A block recipe that never reached the GEMMs would train exactly as per-tensor scaling does.
  const double per_tensor = train_tiny<Model>(model_config, PrecisionMode::kFP8Hybrid,
                                              recipe_config(Fp8Recipe::kDelayed), 1);
  std::printf("%s, mean loss of the last 10%% of 150 steps: BF16 %.4f, DELAYED %.4f", name, bf16,
              per_tensor);
  for (Fp8Recipe recipe : kBlockRecipes) {
    // BLOCKWISE also with two micro-batches per step (the weight copies reused).
    for (int64_t accum : {int64_t{1}, recipe == Fp8Recipe::kBlockwise ? int64_t{2} : int64_t{1}}) {
      const double loss =
          train_tiny<Model>(model_config, PrecisionMode::kFP8Hybrid, recipe_config(recipe), accum);
      const double gap = (loss - bf16) / bf16;
      std::printf(", %s%s %.4f (%+.2f%%)", core::fp8_recipe_name(recipe),
                  accum > 1 ? " x2 micro-batches" : "", loss, 100 * gap);
      // The gaps move with the last bits of FP32 sums (GEMMs, layernorm, attention): over the
      // AMX, VDPBF16PS and AVX2 kernels GPT-2's ROWWISE run ends at 1.8173, 1.8597 and 1.8275
      // and BF16 at 1.8556, 1.8436 and 1.8446, gaps from -2.07% to +0.87%.
      EXPECT_LE(std::fabs(gap), 0.03) << name << " " << core::fp8_recipe_name(recipe);
      EXPECT_NE(loss, per_tensor) << name << " " << core::fp8_recipe_name(recipe);
      EXPECT_NE(loss, bf16) << name << " " << core::fp8_recipe_name(recipe);
      if (recipe != Fp8Recipe::kBlockwise) break;
    }
  }
  std::printf("\n");
}

TEST(Fp8Recipes, TinyGpt2TracksBf16) {
  expect_recipes_track_bf16<models::GPT2>("GPT-2", models::GPT2Config{2, 2, 128, 64, 256});
}

TEST(Fp8Recipes, TinyLlamaTracksBf16) {
  models::LlamaConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.n_embd = 128;
  c.ffn_hidden = 256;
  c.seq_len = 64;
  expect_recipes_track_bf16<models::Llama>("Llama", c);
}

}  // namespace
}  // namespace mantissa::train
