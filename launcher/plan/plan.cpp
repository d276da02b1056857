#include "launcher/plan/plan.h"

#include <cstdio>
#include <set>
#include <string>

#include "core/config_check.h"
#include "core/error.h"
#include "core/ops/flash_attention_switch.h"
#include "core/precision/block_scaling.h"
#include "core/precision/fp8_scaling.h"
#include "launcher/config/cli.h"
#include "launcher/config/config.h"
#include "launcher/config/config_translate.h"
#include "launcher/config/option_value.h"
#include "launcher/plan/plan_model.h"

namespace mantissa::launcher {

const char* const kPlanHelp =
    R"(usage: mantissa plan --config FILE.pbtxt --gpus N [--gpu NAME] [--gpus-per-node G]
                     [--link-gbps B] [--node-gbps V] [--tflops X] [--efficiency E]
                     [--memory-gbps M] [--cores C]
                     [--set path.to.field=value]...

Projects a config's run on N devices from an analytic model (launcher/plan/plan_model.h), without
launching anything or reading the data: memory per device for every precision and ZeRO
stage, and the step's time as compute (the step's FLOPs at the device's peaks, times the
efficiency), the memory-bound passes (AdamW, gradient zeroing, the reduce casts), and the
gradient all-reduce that backward does not hide (ring all-reduce of dist.bucket_mb buckets
over the slowest link); then tokens/s and MFU. The last line, "projection: key=value ...",
is for scripts (memory_gib the config's memory per device, device_gib the device's: 0 when
not known).

options:
  --config FILE      the run's config, as for mantissa train (its data files need not exist)
  --set PATH=VALUE   override one field, as for mantissa train
  --gpus N           devices (ranks) in the job, at most 1,000,000
  --gpu NAME         a100, h100 (the default), h200, or cpu (one CPU rank: give --tflops)
  --gpus-per-node G  devices per node (default: the device's node, 8 GPUs or 1 CPU rank)
  --link-gbps B      each node's network, Gbit/s per direction, all its NICs together
                     (default: 8 x 200 for a100, 8 x 400 for h100 and h200; required for cpu
                     ranks on several nodes)
  --node-gbps V      what a device sends to the rest of its node, GB/s per direction
                     (default: NVLink's for GPUs; required for cpu ranks sharing a node, whose
                     all-reduce goes through shared memory: an all-reduce of S bytes that took
                     t seconds on N ranks of a node moved 2 (N-1)/N S / t)
  --tflops X         the peak of every GEMM precision, TFLOP/s per device (required for cpu:
                     one rank's FP32 FMA peak, e.g. bench_cpu_gemm's "FMA peak" of 1 thread)
  --efficiency E     the step's FLOPs over its compute time, as a fraction of the peaks (default
                     0.5; 0.01 to 4, but at most 1 on a GPU at its own peaks: a CPU whose
                     BF16 dot products outrun its FP32 FMA peak, or one --tflops for every
                     precision, may exceed 1). For a cluster, calibrate it on a measured
                     run: bench/bench_scaling.sh does; on a CPU, calibrate each precision,
                     seq_len and micro-batch apart (one --tflops stands for all precisions,
                     the attention's T x T passes, which count no FLOPs, grow with seq_len, and
                     a larger micro-batch's tensors cost page faults the FLOPs do not show)
  --memory-gbps M    bytes a device moves per second (read + write), GB/s, for the passes
                     whose cost does not grow with the tokens (AdamW, gradient zeroing, the
                     reduce casts); default: the device's (HBM), none for cpu (no such term)
  --cores C          cpu only: all ranks share C cores (hosts of scripts/start-cluster.sh on
                     one machine), each rank computing at most C/N of the time
  -h, --help         this help

Not modelled: the data loader, checkpoints, evaluation, and communication competing with
compute for memory bandwidth or cores. On a CPU the C library's allocator keeps much of what
is freed: evaluations can raise a process's peak memory by up to a quarter over the
projection (measured: 1.2 to 1.6 GiB for 16 evaluation micro-batches), and per-tensor FP8
(DELAYED, CURRENT) may not show the activation memory it saves over BF16.

exit codes: 0 the projection is printed; 2 a bad command line or config (one line saying why)
)";

namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr int kMaxPlanDevices = 1'000'000;

int positive_int(const std::string& option, const std::string& value) {
  const std::optional<int> v = whole_number<int>(value);
  if (!v || *v < 1) {
    throw core::ConfigError(option + " " + value +
                            ": must be a whole number >= 1 (see mantissa plan --help)");
  }
  return *v;
}

std::string format(const char* fmt, double a) {
  char buf[64];
  std::snprintf(buf, sizeof buf, fmt, a);
  return buf;
}

// Bounded by what any device or network is, so that a typo (a missing exponent's sign) is
// told rather than planned: 1e-300 TFLOP/s would print a step of 290 digits.
double number_in(const std::string& option, const std::string& value, double lo, double hi) {
  const std::optional<double> v = finite_number(value);
  if (!v || *v < lo || *v > hi) {
    throw core::ConfigError(option + " " + value + ": must be a number in [" + format("%g", lo) +
                            ", " + format("%g", hi) + "] (see mantissa plan --help)");
  }
  return *v;
}

// 1234567 -> "1.23M"; below 10,000 as it is.
std::string si(double v) {
  if (v >= 1e9) return format("%.2fB", v / 1e9);
  if (v >= 1e6) return format("%.2fM", v / 1e6);
  if (v >= 1e4) return format("%.1fk", v / 1e3);
  return format("%.0f", v);
}

const char* mode_name(TrainConfig::Precision::Mode mode) {
  return TrainConfig::Precision::Mode_Name(mode).c_str();
}

Cluster make_cluster(const PlanArgs& args, const TrainConfig& config) {
  Cluster cluster;
  cluster.device = find_device(args.gpu);
  DeviceSpec& d = cluster.device;
  const bool cpu = d.is_cpu();
  if (args.tflops > 0) d.bf16_tflops = d.fp8_tflops = d.fp32_tflops = args.tflops;
  if (cpu && args.tflops <= 0)
    throw core::ConfigError("--gpu cpu needs --tflops: the FP32 FMA peak of one rank");
  // A GPU's own peaks are what its tensor cores can do at most. A CPU rank's --tflops is its FP32
  // FMA peak, which BF16 dot-product instructions may outrun; one --tflops for every precision
  // may understate FP8's.
  if (args.efficiency > 1 && !cpu && args.tflops <= 0) {
    throw core::ConfigError("--efficiency " + core::format_number(args.efficiency) +
                            ": at most 1 on a GPU at its own peaks (the most it computes)");
  }
  if (args.efficiency > 0) d.efficiency = args.efficiency;
  if (args.link_gbps > 0) d.link_gbit = args.link_gbps;
  if (args.node_gbps > 0) d.node_gbps = args.node_gbps;
  if (args.memory_gbps > 0) d.memory_gbps = args.memory_gbps;
  if (args.cores > 0 && !cpu) throw core::ConfigError("--cores: for --gpu cpu only");
  cluster.ranks = args.gpus;
  cluster.per_node = std::min(args.per_node > 0 ? args.per_node : d.per_node, args.gpus);
  cluster.shared_cores = args.cores;
  if (cluster.per_node > 1 && d.node_gbps <= 0)
    throw core::ConfigError("--node-gbps: needed for " + std::string(d.name) +
                            " ranks sharing a node (" + std::to_string(cluster.per_node) +
                            " per node)");
  if (cluster.ranks > cluster.per_node && d.link_gbit <= 0)
    throw core::ConfigError("--link-gbps: needed for " + std::string(d.name) +
                            " ranks on several nodes (" + std::to_string(cluster.ranks) +
                            " ranks, " + std::to_string(cluster.per_node) + " per node)");
  const bool fp8 = config.precision().mode() == TrainConfig::Precision::FP8_HYBRID;
  if (fp8 && d.fp8_tflops <= 0)
    throw core::ConfigError("precision.mode = FP8_HYBRID: " + std::string(d.description) +
                            " has no FP8 tensor cores");
  if (fp8 && d.compute_capability > 0) {  // a CPU rank runs every recipe
    // The recipe's scale modes, as a run checks them on such a GPU at start.
    const core::Fp8Recipe recipe = fp8_scaling_config(config).recipe;
    for (const auto& [a, b] : core::kLinearGemmRoles) {
      const std::string why = core::gpu_scale_mode_rule(
          core::fp8_scale_mode(recipe, a), core::fp8_scale_mode(recipe, b), d.compute_capability,
          std::string(d.description));
      if (!why.empty()) {
        throw core::ConfigError(
            "precision.fp8.recipe = " + std::string(core::fp8_recipe_name(recipe)) + ": " + why);
      }
    }
  }
  return cluster;
}

std::string memory_table(const TrainConfig& config, const ModelCost& cost, const Cluster& cluster) {
  std::string out = "memory per device, GiB (the config's row marked *):\n";
  out +=
      "   precision    ZeRO  masters  AdamW  grads  weights  reduce    FP8  activations  "
      "runtime   total\n";
  const TrainConfig::Precision::Mode modes[] = {TrainConfig::Precision::FP32,
                                                TrainConfig::Precision::BF16,
                                                TrainConfig::Precision::FP8_HYBRID};
  for (const auto mode : modes) {
    for (int zero = 0; zero <= 1; ++zero) {
      TrainConfig variant = config;
      variant.mutable_precision()->set_mode(mode);
      variant.mutable_dist()->set_zero_stage(zero);
      const MemoryEstimate m = estimate_memory(variant, cost, cluster);
      const bool mine = mode == config.precision().mode() && zero == config.dist().zero_stage();
      char line[256];
      std::snprintf(line, sizeof line,
                    " %c %-11s %5d %8.2f %6.2f %6.2f %8.2f %7.2f %6.2f %12.2f %8.2f %7.2f\n",
                    mine ? '*' : ' ', mode_name(mode), zero, m.masters / kGiB, m.optimizer / kGiB,
                    m.gradients / kGiB, m.weights / kGiB, m.reduce / kGiB, m.fp8 / kGiB,
                    (m.activations + m.working) / kGiB, m.runtime / kGiB, m.total() / kGiB);
      out += line;
    }
  }
  out += uses_flash_attention(config, cost, cluster.device)
             ? "   attention: flash (lse per row; MANTISSA_FLASH_ATTENTION=0 keeps P)\n"
             : "   attention: materialised (the [B, H, T, T] probabilities P kept)\n";
  const double capacity = cluster.device.memory_gib;
  if (capacity > 0) {
    const double mine = estimate_memory(config, cost, cluster).total() / kGiB;
    out += format("   the config's %.1f GiB ", mine) +
           (mine <= capacity ? "fits in " : "does NOT fit in ") +
           format("the device's %.0f GiB\n", capacity);
  }
  return out;
}

}  // namespace

PlanArgs parse_plan_args(const std::vector<std::string>& args) {
  PlanArgs out;
  const std::string usage = " (see mantissa plan --help)";
  std::set<std::string> given;
  out.help = help_asked(args);
  if (out.help) return out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const std::string name = arg.substr(0, arg.find('='));
    static const char* const kOptions[] = {
        "--config", "--set",        "--gpus",  "--gpu",         "--gpus-per-node", "--link-gbps",
        "--tflops", "--efficiency", "--cores", "--memory-gbps", "--node-gbps"};
    bool known = false;
    for (const char* o : kOptions) known = known || name == o;
    if (!known) throw core::ConfigError("unknown argument '" + arg + "'" + usage);
    const std::string value = option_value(args, i, usage);
    // One value each (--set may repeat).
    if (name != "--set") require_given_once(given, name, usage);
    if (name == "--config") {
      out.config_path = value;
    } else if (name == "--set") {
      out.sets.push_back(value);
    } else if (name == "--gpus") {
      out.gpus = positive_int(name, value);
      // Beyond any cluster built: a typo (an extra digit, a byte count) rather than a plan.
      if (out.gpus > kMaxPlanDevices) {
        throw core::ConfigError("--gpus " + value + ": must be at most " +
                                std::to_string(kMaxPlanDevices) +
                                " (more devices than any cluster has)");
      }
    } else if (name == "--gpu") {
      out.gpu = value;
    } else if (name == "--gpus-per-node") {
      out.per_node = positive_int(name, value);
    } else if (name == "--link-gbps") {
      out.link_gbps = number_in(name, value, 1e-3, 1e6);
    } else if (name == "--node-gbps") {
      out.node_gbps = number_in(name, value, 1e-3, 1e6);
    } else if (name == "--tflops") {
      out.tflops = number_in(name, value, 1e-3, 1e6);
    } else if (name == "--memory-gbps") {
      out.memory_gbps = number_in(name, value, 1e-3, 1e6);
    } else if (name == "--efficiency") {
      out.efficiency = number_in(name, value, 0.01, 4);
    } else {
      out.cores = positive_int(name, value);
    }
  }
  if (out.config_path.empty()) throw core::ConfigError("--config FILE.pbtxt is required" + usage);
  if (out.gpus == 0) throw core::ConfigError("--gpus N is required" + usage);
  return out;
}

std::string plan_report(const PlanArgs& args) {
  TrainArgs config_args;
  config_args.config_path = args.config_path;
  config_args.sets = args.sets;
  // Its notes go to stderr, as every command's: the report is for scripts too.
  const TrainConfig config = effective_config_noted(config_args, 0, DataFiles::kSkip);
  const ModelCost cost = model_cost(config.model());
  const Cluster cluster = make_cluster(args, config);
  const DeviceSpec& d = cluster.device;
  if (core::flash_attention_setting() == core::FlashAttentionSetting::kAlways) {
    const std::string missing = missing_flash_kernels(config, cost, d);
    if (!missing.empty()) throw core::ConfigError("MANTISSA_FLASH_ATTENTION=1: " + missing);
  }
  const StepEstimate step = estimate_step(config, cost, cluster);
  const MemoryEstimate memory = estimate_memory(config, cost, cluster);
  const TrainConfig::Dist& dist = config.dist();
  const int nodes = (cluster.ranks + cluster.per_node - 1) / cluster.per_node;

  std::string out = "mantissa plan: " + args.config_path + ": " + cost.family + " of " +
                    si(static_cast<double>(cost.parameters)) + " parameters, " +
                    format("%.3g GFLOP per token\n", cost.flops_per_token / 1e9);
  out += "cluster: " + std::to_string(cluster.ranks) + " x " + std::string(d.name) + " (" +
         std::string(d.description) + "), " + std::to_string(cluster.per_node) + " per node on " +
         std::to_string(nodes) + (nodes == 1 ? " node" : " nodes");
  if (const int last = cluster.ranks % cluster.per_node; last != 0 && nodes > 1)
    out += " (the last with " + std::to_string(last) + ")";
  if (nodes > 1) out += format(", network %g Gbit/s per node", d.link_gbit);
  if (cluster.shared_cores > 0)
    out += ", sharing " + std::to_string(cluster.shared_cores) + " cores";
  out += format(", efficiency %.2f", d.efficiency);
  // No GPU run of mantissa has been measured yet (docs/plan.md): the default is a guess.
  if (args.efficiency <= 0 && !d.is_cpu()) out += " (assumed: --efficiency sets a measured one)";
  out += "\n";
  out +=
      "step: " + std::to_string(config.data().micro_batch_size()) + " sequences x " +
      std::to_string(model_shape(config.model()).seq_len) + " tokens x " +
      std::to_string(config.data().grad_accum_steps()) +
      (config.data().grad_accum_steps() == 1 ? " micro-batch" : " micro-batches") + " per rank x " +
      std::to_string(cluster.ranks) + (cluster.ranks == 1 ? " rank" : " ranks") + " = " +
      si(static_cast<double>(step.tokens)) + " tokens (" + mode_name(config.precision().mode()) +
      ", " + TrainConfig::Dist::ReduceDtype_Name(dist.grad_reduce_dtype()) + " reduce, ZeRO-" +
      std::to_string(dist.zero_stage()) + ", overlap " + (dist.overlap() ? "on" : "off") + ")\n\n";
  out += memory_table(config, cost, cluster) + "\n";

  char lines[1024];
  std::snprintf(lines, sizeof lines, "%.3g GiB of gradients per rank in %lld bucket%s",
                step.gradient_bytes / kGiB, static_cast<long long>(step.buckets),
                step.buckets == 1 ? "" : "s");
  const std::string reduced = cluster.ranks == 1 ? "one rank: nothing to reduce" : lines;
  std::snprintf(
      lines, sizeof lines,
      "time per step (the config's row):\n"
      "  compute     %9.4f s  (%.4g TFLOP per rank at %g TFLOP/s, efficiency %.2f)\n"
      "  memory      %9.4f s  (%.3g GB per rank: AdamW, gradient zeroing, reduce casts)\n"
      "  all-reduce  %9.4f s  (%s)\n"
      "  exposed     %9.4f s  after overlap with backward\n"
      "  step        %9.4f s  %s tokens/s, MFU %.3f\n",
      step.compute_s,
      cost.flops_per_token * static_cast<double>(step.tokens / cluster.ranks) / 1e12,
      config.precision().mode() == TrainConfig::Precision::FP32 ? d.fp32_tflops : d.bf16_tflops,
      d.efficiency, step.memory_s, step.memory_bytes / 1e9, step.comm_s, reduced.c_str(),
      step.exposed_s, step.step_s(), si(step.tokens_per_s()).c_str(), step.mfu);
  out += lines;
  std::snprintf(
      lines, sizeof lines,
      "projection: ranks=%d step_s=%.6g compute_s=%.6g memory_s=%.6g comm_s=%.6g "
      "exposed_s=%.6g tokens_per_s=%.6g mfu=%.4f memory_gib=%.4g device_gib=%.4g buckets=%lld "
      "memory_bytes=%.6g\n",
      cluster.ranks, step.step_s(), step.compute_s, step.memory_s, step.comm_s, step.exposed_s,
      step.tokens_per_s(), step.mfu, memory.total() / kGiB, cluster.device.memory_gib,
      static_cast<long long>(step.buckets), step.memory_bytes);
  out += lines;
  return out;
}

}  // namespace mantissa::launcher
