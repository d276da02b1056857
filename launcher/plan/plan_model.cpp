#include "launcher/plan/plan_model.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"
#include "core/ops/flash_attention_switch.h"
#include "launcher/config/config_translate.h"
#include "launcher/model_config.h"
#include "train/language_model.h"

namespace mantissa::launcher {
namespace {

void set_attention(ModelCost& cost, int64_t layers, int64_t heads, int64_t head_dim, int64_t seq,
                   int64_t width) {
  cost.layers = layers;
  cost.head_dim = head_dim;
  cost.probability_elements = static_cast<double>(heads * seq);
  cost.lse_bytes = 4.0 * static_cast<double>(heads);
  cost.attention_output_elements = static_cast<double>(width);
}

ModelCost gpt2_cost(const models::GPT2Config& c) {
  const int64_t C = c.n_embd, L = c.n_layer, T = c.seq_len;
  // Per block: ln_1, c_attn (C x 3C + bias), c_proj (C x C + bias), ln_2, c_fc (C x 4C + bias),
  // mlp.c_proj (4C x C + bias).
  const int64_t block_weights = 12 * C * C;
  const int64_t block = block_weights + 13 * C;
  ModelCost cost;
  cost.family = "GPT-2";
  cost.parameters = c.vocab_size * C + T * C + L * block + 2 * C;
  cost.flat_parameters = cost.parameters + (c.padded_vocab_size() - c.vocab_size) * C;
  cost.block_linear_parameters = L * block_weights;
  // GPT2::flops_per_token's count: the position table (T x C) is a lookup.
  cost.flops_per_token = train::transformer_flops_per_token(cost.parameters - T * C, L, C, T);
  // Per block (GPT2Block::forward): ln_1's input, c_attn's input, qkv (3C), the attention
  // probabilities (H T), c_proj's input, ln_2's input, c_fc's input, its output (4C) and GELU's
  // (4C, mlp.c_proj's input); the four linears' inputs (7C) are E4M3 under per-tensor FP8.
  const double per_block = 16.0 * C + static_cast<double>(c.n_head * T);
  // + ln_f's input, the head's input and its logit gradients (LMHead keeps them in the
  // compute dtype).
  cost.saved_elements_per_token =
      L * per_block + 2.0 * C + static_cast<double>(c.padded_vocab_size());
  cost.fp8_saved_elements_per_token = 7.0 * L * C;
  // Two LayerNorms' mean and 1/std per block and ln_f's.
  cost.fp32_saved_bytes_per_token = 16.0 * L + 8.0;
  cost.working_elements_per_token = per_block;
  cost.logit_elements_per_token = static_cast<double>(c.padded_vocab_size());
  set_attention(cost, L, c.n_head, C / c.n_head, T, C);
  return cost;
}

ModelCost llama_cost(const models::LlamaConfig& c) {
  const int64_t C = c.n_embd, L = c.n_layer, T = c.seq_len, F = c.ffn_hidden;
  const int64_t q = c.n_head * c.head_dim(), kv = c.n_kv_head * c.head_dim();
  // Per block: q|k|v (C x (q + 2 kv)), o (q x C), gate|up (C x 2F), down (F x C), two RMSNorms.
  const int64_t block_weights = C * (q + 2 * kv) + q * C + 3 * C * F;
  const int64_t tables = c.tie_embeddings ? 1 : 2;
  ModelCost cost;
  cost.family = "Llama";
  cost.parameters = tables * c.vocab_size * C + L * (block_weights + 2 * C) + C;
  cost.flat_parameters = cost.parameters + tables * (c.padded_vocab_size() - c.vocab_size) * C;
  cost.block_linear_parameters = L * block_weights;
  // Llama::flops_per_token's count: an untied input table is a lookup.
  cost.flops_per_token = train::transformer_flops_per_token(
      cost.parameters - (tables - 1) * c.vocab_size * C, L, C, T);
  // Per block (LlamaBlock::forward): the input norm's input, qkv_proj's input, q|k|v with the
  // kv heads repeated (3 q), the probabilities (H T), o_proj's input (q), the post-attention
  // norm's input, gate_up_proj's input, gate|up (2F) and SwiGLU's output (F, down's input);
  // the four linears' inputs are E4M3 under per-tensor FP8.
  const double per_block = 4.0 * C + 4.0 * q + 3.0 * F + static_cast<double>(c.n_head * T);
  cost.saved_elements_per_token =
      L * per_block + 2.0 * C + static_cast<double>(c.padded_vocab_size());
  cost.fp8_saved_elements_per_token = static_cast<double>(L) * (2.0 * C + q + F);
  cost.fp32_saved_bytes_per_token = 8.0 * L + 4.0;
  cost.working_elements_per_token = per_block;
  cost.logit_elements_per_token = static_cast<double>(c.padded_vocab_size());
  set_attention(cost, L, c.n_head, c.head_dim(), T, q);
  return cost;
}

double dtype_bytes(TrainConfig::Precision::Mode mode) {
  return mode == TrainConfig::Precision::FP32 ? 4.0 : 2.0;  // FP8_HYBRID computes in BF16
}

double reduce_bytes(TrainConfig::Dist::ReduceDtype dtype) {
  switch (dtype) {
    case TrainConfig::Dist::FP32: return 4.0;
    case TrainConfig::Dist::BF16:
    case TrainConfig::Dist::FP16: return 2.0;
    default: return 1.0;  // FP8_E4M3, FP8_E5M2
  }
}

bool fp8(const TrainConfig& config) {
  return config.precision().mode() == TrainConfig::Precision::FP8_HYBRID;
}

// Per-tensor recipes keep E4M3 copies of the linears' inputs and weights; the block recipes
// keep the inputs in BF16 and quantise W and its transpose each step.
bool per_tensor_fp8(const TrainConfig& config) {
  const auto recipe = config.precision().fp8().recipe();
  return fp8(config) && (recipe == TrainConfig::Precision::Fp8::DELAYED ||
                         recipe == TrainConfig::Precision::Fp8::CURRENT);
}

// Ranks holding a share of the masters and moments: all of them under ZeRO-1.
double shards(const TrainConfig& config, const Cluster& cluster) {
  return config.dist().zero_stage() == 1 ? cluster.ranks : 1.0;
}

// Bytes per second one rank sends in a collective: the slowest link of the ring.
double rank_bandwidth(const Cluster& cluster) {
  const DeviceSpec& d = cluster.device;
  const int nodes = (cluster.ranks + cluster.per_node - 1) / cluster.per_node;
  const double network = d.link_gbit * 1e9 / 8.0 / cluster.per_node;
  if (nodes == 1) return cluster.per_node > 1 ? d.node_gbps * 1e9 : network;
  return cluster.per_node > 1 ? std::min(d.node_gbps * 1e9, network) : network;
}

}  // namespace

ModelCost model_cost(const TrainConfig::Model& model) {
  if (model.has_llama()) return llama_cost(llama_config(model.llama()));
  if (model.has_mlp())
    throw core::ConfigError("model.mlp: mantissa plan projects GPT-2 and Llama models only");
  return gpt2_cost(gpt2_config(model.gpt2()));
}

std::string missing_flash_kernels(const TrainConfig& config, const ModelCost& cost,
                                  const DeviceSpec& device) {
  if (device.is_cpu()) return "";
  if (config.precision().mode() == TrainConfig::Precision::FP32)
    return "the GPU kernels take BF16 and F16 attention, not precision.mode FP32";
  if (cost.head_dim == 64 || (cost.head_dim == 128 && device.name != "a100")) return "";
  return "no GPU kernel for heads of " + std::to_string(cost.head_dim) + " channels on " +
         std::string(device.description) +
         (cost.head_dim == 128 ? " (128 needs Hopper's shared memory)" : " (64 or 128 only)");
}

bool uses_flash_attention(const TrainConfig& config, const ModelCost& cost,
                          const DeviceSpec& device) {
  return core::flash_attention_chosen(!device.is_cpu(),
                                      missing_flash_kernels(config, cost, device).empty());
}

MemoryEstimate estimate_memory(const TrainConfig& config, const ModelCost& cost,
                               const Cluster& cluster) {
  const double p = static_cast<double>(cost.flat_parameters);
  const double a = dtype_bytes(config.precision().mode());
  const double n = cluster.ranks;
  const TrainConfig::Dist& dist = config.dist();
  MemoryEstimate m;
  m.masters = 4.0 * p / shards(config, cluster);
  m.optimizer = 8.0 * p / shards(config, cluster);
  m.gradients = 4.0 * p;
  m.weights = a * p;
  if (cluster.ranks > 1) {
    const double r = reduce_bytes(dist.grad_reduce_dtype());
    if (r < 4.0) m.reduce = r * p;
    // accumulate_fp32: every rank's chunk of each bucket received (N of them) and summed in
    // FP32; ZeRO-1 otherwise: the rank's chunk received.
    if (dist.accumulate_fp32())
      m.reduce += r * p + 8.0 * p / n;
    else if (dist.zero_stage() == 1)
      m.reduce += r * p / n;
  }
  if (fp8(config))
    m.fp8 =
        (per_tensor_fp8(config) ? 1.0 : 2.0) * static_cast<double>(cost.block_linear_parameters);
  const double fp8_saved = per_tensor_fp8(config) ? 1.0 : a;
  const double tokens =
      static_cast<double>(config.data().micro_batch_size() * model_shape(config.model()).seq_len);
  double saved = cost.saved_elements_per_token, fp32_saved = cost.fp32_saved_bytes_per_token;
  double working = cost.working_elements_per_token;
  if (uses_flash_attention(config, cost, cluster.device)) {
    const double L = static_cast<double>(cost.layers);
    saved -= L * cost.probability_elements;
    working -= cost.probability_elements;
    fp32_saved += L * cost.lse_bytes;
    // The output projection keeps that output itself in BF16, but under FP8_HYBRID only its
    // FP8 copy (per-tensor recipes) or its quantised transpose (block recipes).
    if (fp8(config)) saved += L * cost.attention_output_elements;
  }
  m.activations = tokens * (a * (saved - cost.fp8_saved_elements_per_token) +
                            fp8_saved * cost.fp8_saved_elements_per_token + fp32_saved);
  // The loss reads the FP32 logits while it writes the logit gradients, which the activations
  // count, in a tensor of their own (models/nn/lm_head.h); in FP32 it writes them in place.
  // The logits are gone before backward's working set comes.
  const double logits = a < 4.0 ? 4.0 * cost.logit_elements_per_token : 0.0;
  // A CPU's BF16 GEMM kernels (AVX512-BF16, AMX) pack each operand whole into the calling
  // thread's buffer, which keeps the size of the largest, the logit gradients of the LM head's
  // backward (core/ops/cpu/cpu_gemm_bf16.cpp); counted on every CPU, so that the plan holds
  // where they run (on AVX2-only CPUs it comes out that much above the peak).
  const bool cpu = cluster.device.is_cpu();
  const double packed = cpu && a < 4.0 ? a * cost.logit_elements_per_token : 0.0;
  m.working = tokens * (std::max(a * working, logits) + packed);
  // Measured on CPU: a tiny model's process peaks at about 0.23 GiB, one rank or two.
  m.runtime = (cpu ? 0.25 : 1.0) * 1024.0 * 1024.0 * 1024.0;
  return m;
}

StepEstimate estimate_step(const TrainConfig& config, const ModelCost& cost,
                           const Cluster& cluster) {
  const DeviceSpec& d = cluster.device;
  const TrainConfig::Dist& dist = config.dist();
  const int64_t accum = config.data().grad_accum_steps();
  const int64_t rank_tokens =
      config.data().micro_batch_size() * model_shape(config.model()).seq_len * accum;
  const double n = cluster.ranks;
  StepEstimate s;
  s.tokens = rank_tokens * cluster.ranks;

  // Compute: the block linears at their GEMM precision's peak, the rest (head, attention,
  // embeddings) at the compute dtype's.
  const auto mode = config.precision().mode();
  const double other_peak =
      (mode == TrainConfig::Precision::FP32 ? d.fp32_tflops : d.bf16_tflops) * 1e12;
  const double block_peak = fp8(config) ? d.fp8_tflops * 1e12 : other_peak;
  const double share = cluster.shared_cores > 0 ? std::min(1.0, cluster.shared_cores / n) : 1.0;
  const double block_flops =
      6.0 * static_cast<double>(cost.block_linear_parameters) * static_cast<double>(rank_tokens);
  const double other_flops = cost.flops_per_token * static_cast<double>(rank_tokens) - block_flops;
  s.compute_s = (block_flops / block_peak + other_flops / other_peak) / (d.efficiency * share);

  // The passes over the parameters whose cost does not depend on the tokens, in bytes moved:
  // AdamW reads and writes its masters and moments (24 bytes), reads the gradient (4) and
  // writes the compute copy, over the rank's share; the gradients are zeroed (4); with more
  // than one rank the sync casts them to the reduce dtype and back (8 + 2 r; FP32 scales them
  // in place, 8).
  const double p = static_cast<double>(cost.flat_parameters);
  const double a = dtype_bytes(mode);
  const double r = reduce_bytes(dist.grad_reduce_dtype());
  s.memory_bytes = (28.0 + a) * p / shards(config, cluster) + 4.0 * p;
  if (cluster.ranks > 1) s.memory_bytes += (r < 4.0 ? 8.0 + 2.0 * r : 8.0) * p;
  if (d.memory_gbps > 0) s.memory_s = s.memory_bytes / (d.memory_gbps * 1e9 * share);

  s.gradient_bytes = r * p;
  // Communication: with more than one rank.
  if (cluster.ranks > 1) {
    // The buckets, in the order they are reduced: from the last parameters on, each
    // dist.bucket_mb of FP32 gradients, the remainder in the last.
    const double cap = std::max(1.0, std::floor(dist.bucket_mb() * 1024.0 * 1024.0 / 4.0));
    s.buckets = static_cast<int64_t>(std::ceil(p / cap));
    const double bandwidth = rank_bandwidth(cluster);
    const double latency = 2.0 * std::ceil(std::log2(n)) * d.latency_us * 1e-6;
    const double ring = 2.0 * (n - 1.0) / n;
    // ZeRO-1 reduce-scatters the gradients (half a ring) in the sync and all-gathers the updated
    // weights after the optimizer, where nothing hides it.
    const bool zero1 = dist.zero_stage() == 1;
    const double sync_factor = zero1 ? ring / 2.0 : ring;
    const double backward_s = 2.0 / 3.0 * s.compute_s / static_cast<double>(accum);
    double end = 0, done = 0;
    for (int b = 0; b < s.buckets; ++b) {
      const double elements = std::min(cap, p - done);
      done += elements;
      // FP8 buckets first agree on their amax (one more small all-reduce).
      const double seconds = sync_factor * elements * r / bandwidth + (r == 1.0 ? 2 : 1) * latency;
      const double ready = dist.overlap() ? backward_s * done / p : backward_s;
      end = std::max(end, ready) + seconds;
      s.comm_s += seconds;
    }
    s.exposed_s = std::max(0.0, end - backward_s);
    if (zero1) {
      const double gather = ring / 2.0 * p * a / bandwidth + latency;
      s.comm_s += gather;
      s.exposed_s += gather;
    }
  }
  const double peak = (d.bf16_tflops > 0 ? d.bf16_tflops : d.fp32_tflops) * 1e12;
  s.mfu = s.tokens_per_s() * cost.flops_per_token / (n * peak);
  return s;
}

}  // namespace mantissa::launcher
