// launcher/plan/plan_model.h against what it models: the parameter counts and FLOPs against the
// built models, the activation bytes against what a CPU forward pass really leaves allocated
// (glibc's count of bytes in use), and the step's time against cases worked by hand.
#include <gtest/gtest.h>
#include <malloc.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/device_peaks.h"
#include "core/ops/backend.h"
#include "core/precision/policy.h"
#include "launcher/config/config.h"
#include "launcher/model_config.h"
#include "launcher/plan/plan_devices.h"
#include "launcher/plan/plan_model.h"
#include "tests/common/test_util.h"

using namespace mantissa;
using launcher::Cluster;

namespace {

constexpr const char* kFlashSwitch = "MANTISSA_FLASH_ATTENTION";

TrainConfig config_from(const std::string& text) {
  TrainConfig c = launcher::parse_config_text(text, "test_plan");
  launcher::apply_defaults(c, "test_plan.pbtxt");
  launcher::validate(c, launcher::DataFiles::kSkip);
  return c;
}

const char* const kModels[] = {
    "model { gpt2 { n_layer: 2 n_head: 4 n_embd: 128 seq_len: 64 vocab_size: 300 } }",
    "model { llama { n_layer: 2 n_head: 4 n_kv_head: 2 n_embd: 128 seq_len: 64 vocab_size: 300 } }",
    "model { llama { n_layer: 3 n_head: 4 n_embd: 128 seq_len: 64 vocab_size: 300 "
    "tie_embeddings: true ffn_hidden: 192 } }",
};

// An untied Llama's input table is a lookup: it computes what a tied one does, one output
// projection, and MFU counts the same FLOPs for both (6 N + 6 L C T over the products' N).
TEST(PlanModel, AnUntiedInputTableIsNoCompute) {
  const std::string llama =
      "model { llama { n_layer: 2 n_head: 4 n_embd: 128 seq_len: 64 "
      "vocab_size: 300 tie_embeddings: ";
  std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
  const auto flops = [&](const char* tied) {
    const TrainConfig config = config_from(llama + tied + " } }");
    return launcher::build_model(config, *backend,
                                 core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32))
        ->flops_per_token();
  };
  EXPECT_DOUBLE_EQ(flops("false"), flops("true"));
  const TrainConfig tied = config_from(llama + "true } }");
  const launcher::ModelCost cost = launcher::model_cost(tied.model());
  EXPECT_DOUBLE_EQ(flops("true"), 6.0 * static_cast<double>(cost.parameters) + 6.0 * 2 * 128 * 64);
}

TEST(PlanDevices, GpuPeaksAreTheOnesMfuIsMeasuredAgainst) {
  // plan projects MFU against its table; a run measures it against core's; one data sheet.
  for (const char* name : {"a100", "h100", "h200"}) {
    const launcher::DeviceSpec& d = launcher::find_device(name);
    EXPECT_EQ(d.bf16_tflops * 1e12, core::gpu_bf16_peak_flops(d.description)) << name;
  }
}

TEST(PlanModel, ParametersAndFlopsAreTheBuiltModels) {
  for (const char* text : kModels) {
    SCOPED_TRACE(text);
    const TrainConfig config = config_from(text);
    const launcher::ModelCost cost = launcher::model_cost(config.model());
    std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
    const auto model = launcher::build_model(
        config, *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32));
    EXPECT_EQ(cost.parameters, model->parameter_count());
    EXPECT_EQ(cost.flat_parameters, model->parameters().flat_numel());
    EXPECT_DOUBLE_EQ(cost.flops_per_token, model->flops_per_token());
  }
}

TEST(PlanModel, MlpHasNoPlan) {
  EXPECT_THROW(launcher::model_cost(config_from("model { mlp {} }").model()), core::ConfigError);
}

// Bytes the heap holds now: small blocks in the arenas and large ones mapped on their own.
double heap_in_use() {
  const struct mallinfo2 info = mallinfo2();
  return static_cast<double>(info.uordblks + info.hblkhd);
}

// What forward keeps until backward, measured: the heap after a forward pass minus the heap
// before it (a first forward and backward have grown every scratch buffer of the backend).
void expect_activations_are_what_forward_keeps() {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "AddressSanitizer's allocator is not malloc's: mallinfo2 does not see the heap";
#endif
  for (const char* mode : {"BF16", "FP32", "FP8_HYBRID"}) {
    for (const char* text : kModels) {
      SCOPED_TRACE(std::string(mode) + " " + text);
      constexpr int64_t kB = 4, kT = 64;
      const TrainConfig config = config_from(std::string(text) + " precision { mode: " + mode +
                                             " } data { micro_batch_size: 4 }");
      std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
      const core::PrecisionPolicy policy = launcher::precision_policy(config);
      const auto model = launcher::build_model(config, *backend, policy);
      std::vector<int32_t> tokens(kB * kT), targets(kB * kT);
      for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<int32_t>((i * 37 + 11) % 300);
        targets[i] = static_cast<int32_t>((i * 53 + 5) % 300);
      }
      const train::BatchTensors batch{
          core::Tensor::wrap(tokens.data(), core::Shape{kB, kT}, core::DType::kI32),
          core::Tensor::wrap(targets.data(), core::Shape{kB, kT}, core::DType::kI32)};
      train::StepContext ctx{*backend, policy, model->fp8_operands(), {}, 0};
      model->forward(ctx, batch, 1.0f);
      model->backward(ctx);
      ctx.step = 1;

      const double before = heap_in_use();
      const core::Tensor losses = model->forward(ctx, batch, 1.0f);
      const double kept = heap_in_use() - before - static_cast<double>(losses.nbytes());
      model->backward(ctx);

      const launcher::MemoryEstimate m = launcher::estimate_memory(
          config, launcher::model_cost(config.model()), Cluster{launcher::find_device("cpu")});
      // Under FP8_HYBRID forward also makes the weights' FP8 copies that backward uses.
      const double expected = m.activations + m.fp8;
      EXPECT_NEAR(expected, kept, 0.05 * kept) << "measured " << kept;
    }
  }
}

// With the materialised attention the CPU runs by default, and with flash attention
// (MANTISSA_FLASH_ATTENTION=1), which keeps lse instead of the probabilities.
TEST(PlanModel, ActivationsAreWhatForwardKeeps) {
  const core::ScopedEnv flash(kFlashSwitch, nullptr);
  expect_activations_are_what_forward_keeps();
}

TEST(PlanModel, ActivationsAreWhatForwardKeepsWithFlashAttention) {
  const core::ScopedEnv flash(kFlashSwitch, "1");
  expect_activations_are_what_forward_keeps();
}

// On a GPU, BF16 attention with 64-channel heads runs flash attention unless it is switched
// off: lse (4 H bytes per layer and token) instead of the BF16 probabilities (H T elements),
// and the probabilities leave one layer's working set too. FP32 has no GPU kernel.
TEST(PlanModel, FlashAttentionOnAGpuKeepsLseInsteadOfTheProbabilities) {
  TrainConfig config = config_from(
      "model { gpt2 { n_layer: 2 n_head: 2 n_embd: 128 seq_len: 64 vocab_size: 300 } } "
      "data { micro_batch_size: 4 }");
  const launcher::ModelCost cost = launcher::model_cost(config.model());
  const Cluster h200{launcher::find_device("h200"), 8, 8, 0};
  const double tokens = 4.0 * 64.0;
  const double L = static_cast<double>(cost.layers);
  const auto memory = [&](const TrainConfig& c, const char* setting) {
    const core::ScopedEnv flash(kFlashSwitch, setting);
    return launcher::estimate_memory(c, cost, h200);
  };
  EXPECT_EQ(cost.head_dim, 64);
  EXPECT_TRUE(launcher::uses_flash_attention(config, cost, h200.device));
  const launcher::MemoryEstimate flash = memory(config, nullptr);
  const launcher::MemoryEstimate materialised = memory(config, "0");
  EXPECT_DOUBLE_EQ(materialised.activations - flash.activations,
                   tokens * L * (2.0 * cost.probability_elements - cost.lse_bytes));
  EXPECT_DOUBLE_EQ(materialised.working - flash.working, tokens * 2.0 * cost.probability_elements);
  // =1 changes nothing where kernels exist, and FP32 (no GPU kernel) stays materialised in
  // every setting.
  EXPECT_DOUBLE_EQ(memory(config, "1").activations, flash.activations);
  config.mutable_precision()->set_mode(TrainConfig::Precision::FP32);
  EXPECT_NE(launcher::missing_flash_kernels(config, cost, h200.device), "");
  EXPECT_DOUBLE_EQ(memory(config, nullptr).activations, memory(config, "0").activations);
  EXPECT_DOUBLE_EQ(memory(config, "1").activations, memory(config, "0").activations);
  // An A100 has no 128-channel kernel.
  const TrainConfig wide_heads = config_from(
      "model { gpt2 { n_layer: 2 n_head: 1 n_embd: 128 seq_len: 64 vocab_size: 300 } }");
  const launcher::ModelCost wide_cost = launcher::model_cost(wide_heads.model());
  EXPECT_NE(launcher::missing_flash_kernels(wide_heads, wide_cost, launcher::find_device("a100")),
            "");
  EXPECT_EQ(launcher::missing_flash_kernels(wide_heads, wide_cost, h200.device), "");
}

// 2 CPU ranks on nodes of their own, 1 Gbit/s links: the all-reduce of P BF16 gradients sends
// 2 (N-1)/N P 2 bytes = 2 P bytes at 1e9/8 bytes/s, plus 2 log2(2) = 2 latencies of 50 us.
TEST(PlanModel, StepOfTwoRanksWorkedByHand) {
  TrainConfig config = config_from(
      std::string(kModels[0]) +
      " data { micro_batch_size: 2 grad_accum_steps: 3 } dist { bucket_mb: 1000 overlap: false }");
  const launcher::ModelCost cost = launcher::model_cost(config.model());
  Cluster cluster{launcher::find_device("cpu"), 2, 1, 0};
  cluster.device.bf16_tflops = cluster.device.fp32_tflops = 0.1;
  cluster.device.link_gbit = 1;

  const launcher::StepEstimate s = launcher::estimate_step(config, cost, cluster);
  const double p = static_cast<double>(cost.flat_parameters);
  const double flops = cost.flops_per_token * 2 * 64 * 3;
  EXPECT_DOUBLE_EQ(s.compute_s, flops / (0.1e12 * 0.5));
  EXPECT_EQ(s.buckets, 1);
  EXPECT_DOUBLE_EQ(s.comm_s, 2.0 * p / (1e9 / 8) + 2 * 50e-6);
  EXPECT_DOUBLE_EQ(s.exposed_s, s.comm_s);
  EXPECT_EQ(s.tokens, 2 * 2 * 64 * 3);
  // Bytes moved per parameter: AdamW 24 + 4 + 2 (its BF16 compute copy), zeroing 4, the
  // casts to BF16 and back 4 + 2 + 2 + 4; no time for them without a memory bandwidth.
  EXPECT_DOUBLE_EQ(s.memory_bytes, 46 * p);
  EXPECT_EQ(s.memory_s, 0);
  Cluster measured = cluster;
  measured.device.memory_gbps = 8;
  EXPECT_DOUBLE_EQ(launcher::estimate_step(config, cost, measured).memory_s, 46 * p / 8e9);
  measured.ranks = 4;
  measured.shared_cores = 2;  // half a core each: twice the time
  EXPECT_DOUBLE_EQ(launcher::estimate_step(config, cost, measured).memory_s, 2 * 46 * p / 8e9);
  EXPECT_DOUBLE_EQ(s.mfu, s.tokens_per_s() * cost.flops_per_token / (2 * 0.1e12));

  // One bucket is ready only when backward ends: overlap hides nothing.
  config.mutable_dist()->set_overlap(true);
  EXPECT_DOUBLE_EQ(launcher::estimate_step(config, cost, cluster).exposed_s, s.comm_s);

  // Many small buckets on a fast link without latency: all but the last hide behind backward.
  config.mutable_dist()->set_bucket_mb(0.05);
  cluster.device.link_gbit = 1000;
  cluster.device.latency_us = 0;
  const launcher::StepEstimate fine = launcher::estimate_step(config, cost, cluster);
  const double cap = std::floor(0.05 * 1024 * 1024 / 4);
  EXPECT_EQ(fine.buckets, static_cast<int>(std::ceil(p / cap)));
  const double last = (p - cap * (fine.buckets - 1)) * 2 / (1000e9 / 8);
  EXPECT_NEAR(fine.exposed_s, last, 1e-12);
  EXPECT_LT(fine.exposed_s, 0.5 * fine.comm_s);

  // 4 ranks on 2 shared cores compute at half speed; on 4 cores of their own, at full.
  cluster.ranks = 4;
  cluster.shared_cores = 2;
  EXPECT_DOUBLE_EQ(launcher::estimate_step(config, cost, cluster).compute_s, 2 * s.compute_s);
  cluster.shared_cores = 4;
  EXPECT_DOUBLE_EQ(launcher::estimate_step(config, cost, cluster).compute_s, s.compute_s);
}

// FP8_HYBRID multiplies the block linears at the FP8 peak, the rest at the BF16 peak.
TEST(PlanModel, Fp8BlockLinearsRunAtTheFp8Peak) {
  const TrainConfig bf16 = config_from(std::string(kModels[1]) + " precision { mode: BF16 }");
  const TrainConfig fp8 = config_from(std::string(kModels[1]) + " precision { mode: FP8_HYBRID }");
  const launcher::ModelCost cost = launcher::model_cost(bf16.model());
  const Cluster h100{launcher::find_device("h100")};
  const double tokens = 8 * 64;
  const double block = 6.0 * static_cast<double>(cost.block_linear_parameters) * tokens;
  const double other = cost.flops_per_token * tokens - block;
  EXPECT_DOUBLE_EQ(launcher::estimate_step(bf16, cost, h100).compute_s,
                   (block + other) / 989e12 / 0.5);
  EXPECT_DOUBLE_EQ(launcher::estimate_step(fp8, cost, h100).compute_s,
                   (block / 1979e12 + other / 989e12) / 0.5);
}

// ZeRO-1 keeps 1/N of the masters and moments, and all-gathers the weights after the
// optimizer, where nothing hides it.
TEST(PlanModel, Zero1ShardsTheOptimizerAndExposesTheGather) {
  TrainConfig config = config_from(kModels[0]);
  const launcher::ModelCost cost = launcher::model_cost(config.model());
  const Cluster cluster{launcher::find_device("h200"), 16, 8, 0};
  const launcher::MemoryEstimate plain = launcher::estimate_memory(config, cost, cluster);
  const launcher::StepEstimate plain_step = launcher::estimate_step(config, cost, cluster);
  config.mutable_dist()->set_zero_stage(1);
  const launcher::MemoryEstimate zero = launcher::estimate_memory(config, cost, cluster);
  const double p = static_cast<double>(cost.flat_parameters);
  EXPECT_DOUBLE_EQ(plain.masters, 4 * p);
  EXPECT_DOUBLE_EQ(zero.masters, 4 * p / 16);
  EXPECT_DOUBLE_EQ(zero.optimizer, 8 * p / 16);
  EXPECT_DOUBLE_EQ(zero.gradients, plain.gradients);
  EXPECT_GT(launcher::estimate_step(config, cost, cluster).exposed_s, plain_step.exposed_s);
}

}  // namespace
