// mantissa: the command-line entry point. Each subcommand is one row of kCommands.
#include <algorithm>
#include <cstdio>
#include <exception>
#include <new>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/interrupt.h"
#include "dist/world.h"
#include "launcher/build_info.h"
#include "launcher/config/cli.h"
#include "launcher/config/config.h"
#include "launcher/config/option_value.h"
#include "launcher/exit_codes.h"
#include "launcher/export.h"
#include "launcher/plan/plan.h"
#include "launcher/rank_agreement.h"
#include "launcher/run_dir.h"
#include "launcher/sample.h"
#include "launcher/signals.h"
#include "launcher/tokenize/tokenize.h"
#include "launcher/trainer.h"

namespace mantissa::launcher {
namespace {

constexpr const char* kTrainHelp =
    R"(usage: mantissa train --config FILE.pbtxt [--set PATH=VALUE]... [--progress MODE]

Trains a model as the config describes. The same command runs alone (one rank), under
`mpirun -np N` or under `srun`: every rank finds its place through MPI and computes on GPU
number (local rank modulo the visible GPUs) when run.device is CUDA, or AUTO and a GPU is
visible; on the CPU otherwise. On CPUs start ranks with `mpirun --bind-to none`: mpirun binds
each of 2 or fewer ranks to one core, and unbound ranks divide the cores between them. Before
the model is built, the ranks check that they run one build with the same settings on one kind
of device, each GPU rank on a GPU of its own, reading the same tokens (where the data,
data.tokenizer and model.init_from lie, and metrics, may differ between hosts), into one
run.dir that every rank sees (checkpoints are written there); a job that differs stops (exit 2).

options:
  --config FILE     a TrainConfig in protobuf text format (proto/config.proto; configs/*.pbtxt)
  --set PATH=VALUE  override one field after the file is read, e.g. --set run.steps=100,
                    --set precision.mode=FP16, --set debug.inject_nonfinite_steps=5 (a repeated
                    field gets the value appended), --set 'model.mlp={hidden: 128}' (a message
                    body sets the fields it names, appending to a repeated one, the others keep
                    their values, and selects a oneof member; a field of an unselected member
                    selects it too, with a note naming the member it replaces); may be given
                    many times, later ones win
  --progress MODE   rank 0's progress line on stderr: auto (live when stderr is a terminal),
                    live (one line updated in place; use it under mpirun, whose ranks never
                    see a terminal), lines (a plain line every run.log_every steps, and
                    at the first and last steps, evaluations and skipped steps)
  -h, --help        this help

output, in run.dir (default runs/<config file name without extension>):
  config.pbtxt        the effective config (every default filled in), also printed at start
  log/rank<R>.jsonl   one JSON object per step and rank: step (0-based), loss (this rank's),
                      mean_loss (over the ranks: the progress line's loss), loss_scale,
                      overflow, grad_norm (null when skipped), lr, tokens, epoch (epochs of
                      the training data read by the step's end), tokens_per_s, step_seconds,
                      allreduce_seconds, allreduce_bytes, host_syncs, time,
                      skipped_param (the first parameter, of any rank, whose gradient was not
                      finite) when a step was skipped, and val_loss and eval_seconds on steps that
                      evaluate (run.eval_every); each step once: the lines of steps a resume
                      redoes (after a crash) move to log/rank<R>.rolled_back.jsonl, with a
                      line a crash cut short (not JSON); the log is synced before each
                      checkpoint
  checkpoints/        step_<8 digits>/ and `latest`; a run resumes from them automatically
                      (checkpoint.resume; NEVER refuses a run.dir that holds checkpoints)
  .lock               locked (flock) by rank 0 while the run goes on: a second run on the
                      same run.dir stops with exit code 2; the empty file stays

signals: SIGUSR1, SIGTERM or SIGHUP (a closed terminal) to any rank (mpirun forwards SIGUSR1
to all) stops every rank at the same step after a checkpoint is written (an evaluation under
way gives way to it); the exit code is then 0. One that comes during the start ends the run
before its first step, with nothing to save.
SIGINT (Ctrl-C) does the same with exit code 130, also when another stop signal comes with it
or during that checkpoint; a second Ctrl-C ends the process at once, without a checkpoint. A
stop during the last step lets the run finish (done, exit code 0). A signal the process was
started to ignore stays ignored (nohup's SIGHUP). mpirun itself answers
Ctrl-C or SIGTERM by killing the ranks one second later, before most checkpoints are written,
and exits 1: send it SIGUSR1, or launch through deploy/mantissa-mpirun, which turns Ctrl-C
into SIGUSR1.

environment (CPU runs):
  OMP_NUM_THREADS           threads per rank (default: the rank's share of the CPUs it may
                            run on, divided among the ranks of its host that may run there
                            too (with OMP_PLACES or OMP_PROC_BIND, the CPUs of its places); a
                            value past that share is kept, with a warning)
  MANTISSA_CPU_BF16_GEMM=0  GEMMs with BF16 or FP8 operands run the AVX2/FMA kernel in FP32,
                            as on CPUs without AVX512-BF16, instead of the native kernel, which
                            reads BF16 values and sums below 2^-126 as zero: results then do
                            not depend on whether the CPU has AVX512-BF16
  MANTISSA_CPU_AVX512_CONVERT=0
                            stochastic rounding, FP8 casts, block quantisation, GELU and
                            the attention's products use their AVX2 code on CPUs with AVX-512
                            (the results are the same; for comparison)
  MANTISSA_CPU_AMX=0        on CPUs with AMX (Intel Xeons from Sapphire Rapids on), the
                            native BF16 kernel runs on VDPBF16PS instead of AMX tiles
                            (several times slower there; the last bits of FP32 sums may
                            differ)
  The MANTISSA_CPU_* switches take 0 or 1 (the default); any other value is a config error.

environment (attention):
  MANTISSA_FLASH_ATTENTION  unset: flash attention on a GPU that has kernels for the dtype and
                            head size, the kept [B, H, T, T] probabilities elsewhere; 0: never
                            flash; 1: flash in training (on the CPU as plain loops, about 5x
                            slower, to save memory; a GPU without a kernel for the shape stops
                            with the reason); any other value is a config error

environment (MPI runs):
  MANTISSA_MPI_PROGRESS_THREAD=0
                            no thread of each rank drives MPI's collectives while backward
                            runs (gradient sync then advances only between layers; for
                            comparison: see deploy/README.md); 1 (the default) or 0, any
                            other value is a config error
  MANTISSA_MPI_START_TIMEOUT_S
                            seconds the MPI start (MPI_Init, every rank's host gathered) or
                            end (MPI_Finalize) may take before a rank gives up with exit code
                            3, saying so (a rank of the job that never started, or was
                            stopped after the last step, left the others waiting); default
                            600, 0: no bound, at most 1e9

exit codes:
  0  all steps done, or stopped by SIGUSR1/SIGTERM/SIGHUP after writing a checkpoint (or
     during the start, before the first step)
  1  runtime failure (I/O, a full disk, communication, a checkpoint that cannot be written
     or read)
  2  bad command line or config, including data files and devices it names, a checkpoint in
     run.dir that does not fit it (another model), and files or directories it may not
     access or create (permissions, a read-only file system, a file in the way: run.dir and
     its checkpoints included, on whichever rank it happens); nothing trained, except where a
     token shard holds a token past the vocabulary (the batch reading it stops the run) or a
     path becomes inaccessible during the run
  3  a peer rank stopped answering within dist.timeout_s, or the MPI start or end did not
     finish within MANTISSA_MPI_START_TIMEOUT_S
  4  training diverged: the loss is not finite, or gradients stayed non-finite at the
     minimum loss scale for precision.loss_scale.max_overflows_at_min steps in a row
  130  interrupted by SIGINT (Ctrl-C) after writing a checkpoint, or during the start, before
       the first step (nothing new to save); a second Ctrl-C ends the process by the signal,
       without the checkpoint, which a shell shows as 130 too: the last line of output tells
       them apart
  other codes above 128: a rank was killed by signal (code - 128; 137 is SIGKILL, as the
     kernel's OOM killer sends), without a checkpoint; mpirun or srun names the rank

defaults of fields the config leaves unset:
)";

constexpr const char* kConfigHelp =
    R"(usage: mantissa config --config FILE.pbtxt [--set PATH=VALUE]... [--get PATH]

Reads and checks a config as `mantissa train` does before it starts, and prints the effective
config: every --set applied and every default filled in; with --get PATH only that field's
value, for scripts. Left to `train` are the checks that need the ranks, the device or the
data's contents: the data files must exist, but their headers, token ids (against the
vocabulary size) and the tokenizer's piece count (against it too) are read when train loads
them.

options:
  --config FILE     a TrainConfig in protobuf text format, as train reads it
  --set PATH=VALUE  override one field after the file is read, as train does (see
                    mantissa train --help); may be given many times, later ones win
  --get PATH        print only this field's value (a string as it is, without quotes or
                    escapes: --get run.dir is the run directory train uses)
  -h, --help        this help

exit codes: 0 the config is valid; 2 a bad command line or config (one line saying why)
)";

constexpr const char* kExportHelp =
    R"(usage: mantissa export --config FILE.pbtxt [--set PATH=VALUE]... --out FILE.safetensors
       mantissa export --config FILE.pbtxt [--set PATH=VALUE]... --format hf --out DIR
       mantissa export --run DIR ... (in place of --config)

Writes the FP32 weights of the newest intact checkpoint in <run.dir>/checkpoints, the run the
config describes. Runs as one process (no mpirun needed); the training data need not be there.
The output appears only once complete. An export interrupted (Ctrl-C, SIGTERM, SIGHUP) removes
what it wrote and ends by the signal (130 for Ctrl-C); one killed (SIGKILL, a crash) leaves its
temporary FILE.<pid>-<n>.tmp (or DIR.tmp), which the next export to the same --out removes.

options:
  --config FILE     the run's config, as for mantissa train
  --run DIR         the run directory, as for mantissa sample: its config.pbtxt (the effective
                    config training wrote) with run.dir set to DIR
  --set PATH=VALUE  override one field, as for mantissa train
  --format FORMAT   safetensors (the default): one file with mantissa's parameter names
                    (GPT-2: wte, wpe, h.<i>.attn.c_attn.weight, ...; Llama: embed_tokens.weight,
                    layers.<i>.self_attn.qkv_proj.weight, ...), matrices stored [out, in], the
                    vocabulary without its padding rows, the step and the effective config in
                    __metadata__.
                    hf: a Hugging Face model directory, which transformers loads as
                    GPT2LMHeadModel or LlamaForCausalLM and model.init_from reads:
                    model.safetensors with transformers' tensor names and layouts, config.json,
                    and tokenizer.model when the run has one (data.tokenizer, else the one
                    beside the token shards). GPT-2 and Llama only. DIR must not exist or be
                    empty, nor be a symbolic link; it is written as DIR.tmp and renamed to
                    DIR once complete.
  --out PATH        the file (safetensors; it must not exist) or directory (hf) to write
  -h, --help        this help

exit codes: 0 written; 1 no checkpoint is intact, or a checkpoint or the output cannot be
read or written (I/O, a full disk); 2 a bad command line or config, no checkpoint at all, a
model config other than the checkpoint's, an existing FILE (also one that appears while the
weights are written: it is left as it is) or non-empty DIR, a symbolic link as DIR, a FILE
whose directory does not exist, a file or directory it may not access (permissions, read-only), or
--format hf for a model without a Hugging Face layout (model.mlp).
)";

void print_train_help() {
  std::fputs(kTrainHelp, stdout);
  std::fputs(describe_defaults().c_str(), stdout);
}

// Reports an error found before the run once per job (rank 0, which every rank's verdict
// reaches).
void report_config_error(int rank, const std::string& message) {
  if (rank == 0) std::fprintf(stderr, "mantissa: %s\n", message.c_str());
}

// check_initial_weights for a start that will read them: a run.dir with checkpoints resumes
// (or, with checkpoint.resume NEVER, is refused), and a fine-tuned run's requeue must not need
// the weights it started from, which may be gone by then.
void check_initial_weights_of_a_fresh_start(const TrainConfig& config) {
  if (config.model().init_from().empty()) return;
  if (!checkpoint::list_checkpoints(run_checkpoints_dir(config.run().dir())).empty()) return;
  check_initial_weights(config.model());
}

// What sizes a run's memory, for a run that ran out of it.
constexpr const char* kMemoryAdvice =
    "lower data.micro_batch_size, the model's seq_len or its size, or run fewer ranks per host "
    "(mantissa plan estimates the memory a config needs)";

int train_command(int argc, char** argv) {
  const std::vector<std::string> args(argv + 2, argv + argc);
  if (help_asked(args)) {
    print_train_help();
    return kExitOk;
  }

  install_stop_handlers();  // before MPI and the setup, which may take long (shards, resume)
  dist::World world(&argc, &argv);
  TrainArgs parsed;
  TrainConfig config;
  // Every rank reads its config itself (hosts may hold copies of their own), so the verdicts are
  // gathered, each "<exit code> <message>" or empty: a config refused (or unreadable) on any rank
  // ends every rank with the first refusing rank's code, none left waiting for one that has
  // left, and rank 0 says why, naming the rank when its own config was fine.
  std::string refused;
  try {
    parsed = parse_train_args("train", args);
    config = effective_config_noted(parsed, world.rank());
    check_initial_weights_of_a_fresh_start(config);
    validate_for_world(config, world.size(), world.local_rank());
  } catch (const core::ConfigError& e) {
    refused = std::to_string(kExitConfig) + " " + e.what();
  } catch (const core::Error& e) {
    refused = std::to_string(core::exit_code(e.kind())) + " error: " + e.what();
  } catch (const std::exception& e) {
    refused = std::to_string(kExitFailure) + " error: " + core::error_text(e);
  }
  // The wait for the others: this rank's dist.timeout_s, or its default.
  TrainConfig timeouts = refused.empty() ? config : TrainConfig();
  if (!refused.empty()) apply_defaults(timeouts, parsed.config_path);
  const std::vector<std::string> verdicts = world.all_gather(refused, timeouts.dist().timeout_s());
  const auto first_refused = std::find_if(verdicts.begin(), verdicts.end(),
                                          [](const std::string& v) { return !v.empty(); });
  if (first_refused != verdicts.end()) {
    const auto rank = first_refused - verdicts.begin();
    const size_t space = first_refused->find(' ');
    const std::string message = first_refused->substr(space + 1);
    report_config_error(world.rank(),
                        rank == 0 ? message : "rank " + std::to_string(rank) + ": " + message);
    return std::stoi(first_refused->substr(0, space));
  }
  if (world.rank() == 0) {
    std::printf("# effective config (%s)\n%s", parsed.config_path.c_str(), to_text(config).c_str());
    std::fflush(stdout);
  }

  // A job of several ranks aborts on an error, even one found alike on every rank, so that no
  // rank is left waiting for one that failed alone (a port already taken on one node). One rank
  // alone just reports it and exits, without MPI_Abort's banner; so does every rank of a job
  // whose ranks disagree (RanksDisagree), which all of them find from the same table.
  const auto fail = [&](int exit_code, const std::string& message) {
    if (world.size() > 1) world.abort(exit_code, message);
    std::fprintf(stderr, "mantissa: %s\n", message.c_str());
    return exit_code;
  };
  try {
    Trainer trainer(world, config, parsed.progress);
    return trainer.run();
  } catch (const RanksDisagree& e) {
    report_config_error(world.rank(), e.what());
    return kExitConfig;
  } catch (const core::ConfigError& e) {
    return fail(kExitConfig, e.what());
  } catch (const core::OutOfMemory& e) {
    return fail(kExitFailure, std::string("error: ") + e.what() + "; " + kMemoryAdvice);
  } catch (const core::Error& e) {
    return fail(core::exit_code(e.kind()), std::string("error: ") + e.what());
  } catch (const std::bad_alloc&) {
    return fail(kExitFailure,
                std::string("error: out of host memory (std::bad_alloc); ") + kMemoryAdvice);
  } catch (const std::exception& e) {
    return fail(kExitFailure, std::string("error: ") + e.what());
  }
}

int config_command(int argc, char** argv) {
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    const TrainArgs parsed = parse_train_args("config", args);
    if (parsed.help) {
      std::fputs(kConfigHelp, stdout);
      return kExitOk;
    }
    const TrainConfig config = effective_config_noted(parsed, 0);
    check_initial_weights_of_a_fresh_start(config);
    std::fputs((parsed.get.empty() ? to_text(config) : config_value(config, parsed.get)).c_str(),
               stdout);
    return kExitOk;
  } catch (const core::ConfigError& e) {
    report_config_error(0, e.what());
    return kExitConfig;
  }
}

int export_command(int argc, char** argv) {
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    const TrainArgs parsed = parse_train_args("export", args);
    if (parsed.help) {
      std::fputs(kExportHelp, stdout);
      return kExitOk;
    }
    if (!parsed.run_dir.empty()) require_run_directory(parsed.run_dir);
    // The weights come from the checkpoints: the training data need not be there.
    const TrainConfig config = effective_config_noted(parsed, 0, DataFiles::kSkip);
    core::InterruptWatch interrupt;  // Ctrl-C leaves no temporary file behind
    const std::string from = export_checkpoint_weights(
        config, parsed.out, parsed.hf_format ? ExportFormat::kHf : ExportFormat::kSafetensors);
    std::fprintf(stderr, "mantissa: wrote %s from %s\n", parsed.out.c_str(), from.c_str());
    core::throw_if_interrupted("after the export finished (its output is complete)");
    return kExitOk;
  } catch (const core::Interrupted& e) {
    std::fprintf(stderr, "mantissa: %s\n", e.what());
    core::end_by_signal(e.signal());
  } catch (const std::exception& e) {
    return report_failure(e);
  }
}

int plan_command(int argc, char** argv) {
  const std::vector<std::string> args(argv + 2, argv + argc);
  try {
    const PlanArgs parsed = parse_plan_args(args);
    if (parsed.help) {
      std::fputs(kPlanHelp, stdout);
      return kExitOk;
    }
    std::fputs(plan_report(parsed).c_str(), stdout);
    return kExitOk;
  } catch (const core::ConfigError& e) {
    report_config_error(0, e.what());
    return kExitConfig;
  }
}

int help_command(int argc, char** argv);

struct Command {
  const char* name;
  const char* summary;
  int (*run)(int argc, char** argv);  // argv[1] is the command's name
};

constexpr Command kCommands[] = {
    {"train", "train a model from a config (alone, under mpirun or under srun)", train_command},
    {"config", "check a config and print it with every default filled in", config_command},
    {"export", "write a run's newest checkpoint as safetensors or a Hugging Face directory",
     export_command},
    {"plan", "project memory, step time, tokens/s and MFU of a config on N GPUs", plan_command},
    {"tokenize", "train a tokenizer, turn text files into token shards and back", tokenize_command},
    {"sample", "generate text from a run's checkpoint", sample_command},
    {"help", "this overview, or `mantissa help COMMAND` for one command", help_command},
};

void print_overview(std::FILE* out) {
  std::fputs(
      "mantissa: data-parallel mixed-precision pretraining of GPT-style language models\n\n"
      "usage: mantissa COMMAND [options]\n       mantissa --version\n\ncommands:\n",
      out);
  for (const Command& c : kCommands) std::fprintf(out, "  %-9s %s\n", c.name, c.summary);
  std::fputs(
      "\n`mantissa COMMAND --help` describes a command's options and exit codes.\n"
      "`mantissa --version` names the build (version, commit) and the libraries it loaded.\n",
      out);
}

int help_command(int argc, char** argv) {
  const std::string topic = argc < 3 ? "" : argv[2];
  if (topic.empty() || topic == "help" || topic == "-h" || topic == "--help") {
    print_overview(stdout);
    return kExitOk;
  }
  for (const Command& c : kCommands) {
    if (topic == c.name) {
      char name[] = "mantissa";
      char help[] = "--help";
      char* args[] = {name, argv[2], help, nullptr};
      return c.run(3, args);
    }
  }
  std::fprintf(stderr, "mantissa: no command '%s' (see mantissa --help)\n", argv[2]);
  return kExitConfig;
}

int main_impl(int argc, char** argv) {
  if (argc < 2) {
    print_overview(stderr);
    return kExitConfig;
  }
  const std::string command = argv[1];
  if (command == "-h" || command == "--help") {
    print_overview(stdout);
    return kExitOk;
  }
  if (command == "--version") {
    std::fputs(version_report().c_str(), stdout);
    return kExitOk;
  }
  for (const Command& c : kCommands) {
    if (command == c.name) return c.run(argc, argv);
  }
  std::fprintf(stderr, "mantissa: unknown command '%s' (see mantissa --help)\n", command.c_str());
  return kExitConfig;
}

}  // namespace
}  // namespace mantissa::launcher

int main(int argc, char** argv) {
  try {
    return mantissa::launcher::main_impl(argc, argv);
  } catch (const std::exception& e) {
    // What escapes the commands: MPI that cannot start, say.
    return mantissa::launcher::report_failure(e);
  }
}
