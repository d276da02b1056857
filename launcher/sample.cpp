#include "launcher/sample.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "core/ops/backend.h"
#include "core/precision/policy.h"
#include "core/strings.h"
#include "launcher/config/config.h"
#include "launcher/config/config_diff.h"
#include "launcher/config/option_value.h"
#include "launcher/exit_codes.h"
#include "launcher/export.h"
#include "launcher/model_config.h"
#include "launcher/run_dir.h"
#include "launcher/tokenize/tokenize_client.h"
#include "models/gpt2/gpt2.h"
#include "models/gpt2/gpt2_decoder.h"
#include "models/llama/llama.h"
#include "models/llama/llama_decoder.h"
#include "models/sampling.h"

namespace mantissa::launcher {

namespace fs = std::filesystem;

namespace {

constexpr const char* kHelp =
    R"(usage: mantissa sample --run DIR [--step N] [--prompt TEXT] [--max-new-tokens N]
                       [--temperature T] [--top-k K] [--top-p P] [--seed S]
                       [--end-of-text mark|stop] [--device AUTO|CPU|CUDA]

Generates text with the GPT-2 or Llama model of a `mantissa train` run. Reads DIR/config.pbtxt (the
run's effective config), loads the FP32 weights of the newest intact checkpoint in
DIR/checkpoints (or of step N), continues the prompt one token at a time with a KV cache, and
prints the prompt and its continuation on stdout as they are generated, then a newline. What
it loaded and how fast it went goes to stderr. One process, no mpirun.

options:
  --run DIR           the run directory (run.dir of the training run)
  --step N            the checkpoint of step N (DIR/checkpoints/step_<N>), not the newest
  --prompt TEXT       the text to continue (default empty: the start of a document)
  --max-new-tokens N  tokens to generate (default 256)
  --temperature T     the logits are divided by T before the softmax: below 1 sharpens, above
                      1 flattens; 0 is greedy, always the most likely token (default 1)
  --top-k K           draw among the K most likely tokens only (exactly K: the lower ids
                      among equally likely ones); 0: among all (default 0)
  --top-p P           draw among the fewest most likely tokens whose probabilities (at the
                      temperature, after --top-k) sum to at least P, the one that reaches P
                      included: nucleus sampling, as Hugging Face's top_p; 1: among all
                      (default 1)
  --seed S            seed of the draws: the same seed, checkpoint, prompt, options and device
                      give the same text (default 1)
  --end-of-text E     what an end-of-text token drawn (a document's end; tokenizers only)
                      does: mark prints <|endoftext|> there and generation goes on, as llm.c
                      shows it; stop ends the generation there, as Hugging Face's generate
                      stops at its eos_token_id (default mark)
  --device D          AUTO (a GPU when one is visible; the default), CPU or CUDA
  -h, --help          this help
Options take `--opt value` or `--opt=value`.

tokens: the run's tokenizer turns the prompt into tokens and the tokens into text:
  data.tokenizer when the config sets it, else tokenizer.model in the directory of
  data.token_shards.pattern (where `mantissa tokenize encode` puts it); synthetic and
  text_file data, and token shards of vocab_size at most 256 without a tokenizer.model, are bytes.
  With a tokenizer the prompt starts with the end-of-text token, as every document of the
  shards does (it prints nothing), and only the tokenizer's ids are drawn. With bytes an
  empty prompt starts from a newline, which is not printed.

the window: the model sees at most its seq_len tokens (model.gpt2 or model.llama). A longer
  prompt keeps its last seq_len tokens (all of it is printed). When generation fills the
  window it slides: the cache is refilled with the last seq_len / 2 tokens, so every token is
  drawn with at least seq_len / 2 tokens of context, and the positions stay within the
  model's seq_len.

threads: OMP_NUM_THREADS (default: every CPU). They sleep while they wait
  (OMP_WAIT_POLICY=passive, unless you set a policy or thread binding: OMP_PROC_BIND,
  OMP_PLACES, GOMP_CPU_AFFINITY), because sampling often shares the CPU with a training run:
  threads that spin wait for descheduled ones at every step.

exit codes:
  0  done
  1  runtime failure: no checkpoint is intact, a file cannot be read (I/O), mantissa-tokenize
     fails
  2  bad command line or input: an unknown option, a temperature or top-k below 0, a top-p
     outside (0, 1], a file or directory it may not access (permissions), a --run that is
     missing or not a directory, a run directory without config.pbtxt or without a
     checkpoint, a step that has no checkpoint, a tokenizer file that is missing (named) or
     refused, a prompt that is not valid UTF-8 for a tokenizer (bytes take any prompt whose
     bytes the vocabulary holds), a config that the checkpoint does not fit, a model other
     than GPT-2 or Llama, --device CUDA without a GPU
)";

const std::string kUsage = " (see mantissa sample --help)";

// A command-line value out of range, with the hint to the help.
[[noreturn]] void bad_value(const std::string& name, const std::string& value,
                            const std::string& rule) {
  throw core::ConfigError(name + " " + value + ": " + rule + kUsage);
}

// Something the command line names that is not usable (a directory, a checkpoint).
[[noreturn]] void bad_input(const std::string& name, const std::string& value,
                            const std::string& rule) {
  throw core::ConfigError(name + " " + value + ": " + rule);
}

template <class T>
T parse_integer(const std::string& name, const std::string& value, T minimum) {
  const std::optional<T> out = whole_number<T>(value);
  if (!out) bad_value(name, "'" + value + "'", "takes an integer");
  if (*out < minimum) bad_value(name, value, "must be >= " + std::to_string(minimum));
  return *out;
}

// Where the run's tokenizer is (run_tokenizer_file), or none for bytes. Throws
// core::ConfigError naming the file the config names that is missing, or the shards whose
// tokenizer is not beside them.
std::optional<std::string> find_tokenizer(const TrainConfig& config) {
  const TrainConfig::Data& data = config.data();
  require_named_tokenizer(config, "mantissa sample");
  const std::optional<std::string> found = run_tokenizer_file(config);
  const fs::path beside = shards_tokenizer_path(data.token_shards().pattern());
  std::error_code ec;
  const bool beside_exists = fs::exists(beside, ec);
  require(found || !data.has_token_shards() || shard_ids_are_bytes(config),
          "data.token_shards.pattern", "\"" + data.token_shards().pattern() + "\"",
          "has no tokenizer beside it: " + beside.string() +
              (beside_exists ? " is not a regular file" : " is missing") +
              run_relative_hint(beside, "mantissa sample") +
              " (sample decodes with the SentencePiece model that mantissa tokenize encode "
              "writes beside its shards, or data.tokenizer; shards from other tools, such as "
              "llm.c's GPT-2 BPE ones, it cannot decode)");
  return found;
}

// Loads the masters of the run's checkpoint (args.step, or the newest intact one) into
// `params` and refreshes the compute copy; returns the checkpoint's directory and step.
std::pair<std::string, int64_t> load_weights(const SampleArgs& args, const TrainConfig& config,
                                             train::ParameterStore& params,
                                             core::Backend& backend) {
  const fs::path dir = run_checkpoints_dir(args.run_dir);
  checkpoint::Checkpointer checkpointer(checkpoint::CheckpointOptions{dir.string(), 0},
                                        checkpoint::CheckpointGroup{}, backend);
  const std::vector<checkpoint::ParameterLayout> layout = checkpoint::parameter_layout(params);
  const std::vector<checkpoint::BufferSlice> slices = {checkpoint::whole_masters(params)};
  std::optional<checkpoint::CheckpointState> state;
  try {
    state = args.step ? checkpointer.load_step(*args.step, layout, slices)
                      : checkpointer.load_latest(layout, slices);
  } catch (const checkpoint::CheckpointMisfit& e) {
    throw core::ConfigError(e.what() + misfit_explanation(e.config_text(), config,
                                                          "the run's config.pbtxt describes "
                                                          "another model than this checkpoint's"));
  }
  if (args.step) {
    if (!state) {
      std::vector<int64_t> saved = checkpointer.steps();
      std::sort(saved.begin(), saved.end());
      const std::string list = core::join(saved, ", ", [](int64_t s) { return std::to_string(s); });
      bad_input("--step", std::to_string(*args.step),
                "no checkpoint " + (dir / checkpoint::checkpoint_dir_name(*args.step)).string() +
                    " (the steps saved: " + (list.empty() ? "none" : list) + ")");
    }
  }
  if (!state) {
    bad_input("--run", args.run_dir,
              "holds no checkpoint (" + dir.string() + " " +
                  checkpoint::no_checkpoint_reason(dir.string()) + ")");
  }
  params.refresh_compute_copy(backend);
  return {(dir / checkpoint::checkpoint_dir_name(state->step)).string(), state->step};
}

// The prompt and its continuation on stdout while they are generated. With a tokenizer a
// flush decodes all tokens so far, since a character outside the vocabulary is several byte
// tokens that decode only together: the text written is a prefix of the final one, and up to
// three trailing U+FFFD (the bytes so far of such a character, one each) wait for the next
// flush. A flush comes at most every kMinFlushInterval and at least 10 decodes' time after the
// last, so that decoding (a mantissa-tokenize process, over a growing text) takes under a tenth
// of the time. Without a tokenizer every token is a byte.
class TextStream {
 public:
  using Clock = std::chrono::steady_clock;

  TextStream(const TokenizerClient* tokenizer, std::vector<int32_t> prompt, std::string text)
      : tokenizer_(tokenizer), tokens_(std::move(prompt)), bytes_(std::move(text)) {
    flush(false);
  }
  void add(int32_t token) {
    tokens_.push_back(token);
    bytes_.push_back(static_cast<char>(token));
    if (Clock::now() - last_flush_ >= interval_) flush(false);
  }
  void finish() {
    flush(true);
    write("\n");
  }
  // Time spent writing the text, decoding included.
  double seconds() const { return seconds_; }

 private:
  static constexpr std::chrono::duration<double> kMinFlushInterval{0.2};

  // The text so far: the bytes, or the tokens decoded with <|endoftext|> where a document
  // ended (the prompt's leading end-of-text starts the first document and shows nothing).
  std::string text() const {
    if (!tokenizer_) return bytes_;
    std::string text;
    const std::span<const int32_t> all(tokens_);
    size_t begin = 0;
    for (size_t i = 1; i <= all.size(); ++i) {
      if (i < all.size() && all[i] != tokenizer_->eot()) continue;
      if (i > begin) text += tokenizer_->decode(all.subspan(begin, i - begin));
      if (i < all.size()) text += "<|endoftext|>";
      begin = i + 1;
    }
    return text;
  }

  void flush(bool last) {
    const Clock::time_point start = Clock::now();
    const std::string text = this->text();
    constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
    size_t end = text.size();
    for (int held = 0; !last && held < 3 && end >= written_ + kReplacement.size() &&
                       std::string_view(text).substr(end - kReplacement.size()) == kReplacement;
         ++held) {
      end -= kReplacement.size();
    }
    write(std::string_view(text).substr(written_, end - written_));
    written_ = end;
    last_flush_ = Clock::now();
    const std::chrono::duration<double> took = last_flush_ - start;
    seconds_ += took.count();
    interval_ = std::max(kMinFlushInterval, 10 * took);
  }
  static void write(std::string_view text) {
    MANTISSA_REQUIRE(
        std::fwrite(text.data(), 1, text.size(), stdout) == text.size() && std::fflush(stdout) == 0,
        kFailure, "cannot write the text to stdout");
  }

  const TokenizerClient* tokenizer_;
  std::vector<int32_t> tokens_;  // the prompt's and those generated
  std::string bytes_;            // without a tokenizer: the prompt's text and the tokens
  size_t written_ = 0;           // bytes of the text on stdout
  Clock::time_point last_flush_;
  std::chrono::duration<double> interval_ = kMinFlushInterval;
  double seconds_ = 0.0;
};

std::unique_ptr<core::Backend> make_sample_backend(const std::string& device, std::string& name) {
  const bool cuda = device == "CUDA" || (device == "AUTO" && core::cuda_device_available());
  if (device == "CUDA" && !core::cuda_device_available()) {
    bad_input("--device", "CUDA",
              "no CUDA device is visible to this process (or this build has no CUDA backend)");
  }
  name = cuda ? "CUDA device 0" : "the CPU";
  return cuda ? core::make_cuda_backend(0) : core::make_cpu_backend();
}

// OpenMP threads that sleep while they wait. mantissa sample often shares the CPU with other
// work (the training run whose checkpoints it reads), and a token is many small parallel
// regions: with libgomp's default, threads spin at every barrier, waiting region after region
// for a thread the kernel has descheduled. GPT-2 124M on 2 cores, one kept busy by another
// process: 5.0 tokens/s spinning, 8.1-8.9 sleeping (one thread: 8.5); on idle cores 15-16 either
// way. libgomp reads OMP_WAIT_POLICY once, when it loads, so the process starts its own
// executable again with the policy set (by its path, so that ps and pgrep still see
// "mantissa"). It does not when the user set a policy, or set thread binding: libgomp has
// then pinned this thread to the first place already, and the new process would inherit that
// one place's CPUs. Where the executable cannot be found or run, sampling goes on with
// libgomp's default.
void let_openmp_threads_sleep(char** argv) {
  for (const char* name : {"OMP_WAIT_POLICY", "OMP_PROC_BIND", "OMP_PLACES", "GOMP_CPU_AFFINITY"}) {
    if (std::getenv(name) != nullptr) return;
  }
  std::error_code ec;
  const fs::path executable = fs::read_symlink("/proc/self/exe", ec);
  if (ec || !fs::is_regular_file(executable, ec)) return;  // gone (" (deleted)"): rebuilt
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  execv(executable.c_str(), argv);
  unsetenv("OMP_WAIT_POLICY");
}

int run_sample(const SampleArgs& args) {
  validate_environment();
  require_run_directory(args.run_dir);
  const fs::path config_path = run_config_file(args.run_dir);
  TrainConfig config = load_config_file(config_path.string());
  apply_defaults(config, config_path.string());
  if (config.model().has_mlp()) {
    bad_input("--run", args.run_dir,
              "trains model.mlp, which has no attention to generate with; mantissa sample "
              "needs a GPT-2 or Llama model");
  }
  const ModelShape shape = model_shape(config.model());
  const int64_t vocab = shape.vocab_size;
  const std::optional<std::string> tokenizer_path = find_tokenizer(config);
  std::optional<TokenizerClient> tokenizer;
  if (tokenizer_path) {
    tokenizer.emplace(*tokenizer_path);
    require(tokenizer->vocab_size() <= vocab, shape.prefix + ".vocab_size", std::to_string(vocab),
            "is smaller than the " + std::to_string(tokenizer->vocab_size()) +
                " pieces of the tokenizer " + *tokenizer_path + " (not the run's tokenizer?)");
  }
  // Check the sampling options and the prompt before the (possibly long) load. A tokenizer's <unk>
  // and <s> are never drawn: no training text held them (SentencePiece prints <unk> as " \u2047 ").
  const models::SamplingOptions options{
      args.temperature, args.top_k, args.seed, args.top_p,
      tokenizer ? tokenizer->never_encoded() : std::vector<int32_t>{}};
  models::TokenSampler sampler(options);

  // The prompt's tokens: a document's start (end of text) and the text, or its bytes.
  std::vector<int32_t> prompt;
  if (tokenizer) {
    prompt.push_back(tokenizer->eot());
    const std::vector<int32_t> ids = tokenizer->encode(args.prompt);
    prompt.insert(prompt.end(), ids.begin(), ids.end());
  } else if (args.prompt.empty()) {
    prompt.push_back('\n');
  } else {
    for (const char c : args.prompt) prompt.push_back(static_cast<unsigned char>(c));
  }
  // Bytes are ids: a vocabulary of fewer than 256 ids has no token for the bytes past it.
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < vocab) continue;
    bad_value("--prompt", "'" + args.prompt + "'",
              args.prompt.empty()
                  ? "an empty prompt starts from a newline (10), which a vocabulary of " +
                        std::to_string(vocab) + " ids lacks: give a prompt"
                  : "byte " + std::to_string(i) + " is " + std::to_string(prompt[i]) +
                        ", past the model's vocabulary of " + std::to_string(vocab) +
                        " ids (each byte is a token)");
  }

  std::string device_name;
  const std::unique_ptr<core::Backend> backend = make_sample_backend(args.device, device_name);
  // The masters are FP32, and generation runs in FP32 from them.
  const std::unique_ptr<train::LanguageModel> model =
      build_model(config, *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32));
  const auto [checkpoint_dir, step] = load_weights(args, config, model->parameters(), *backend);

  const int64_t window = shape.seq_len;
  const int64_t vocab_limit = tokenizer ? tokenizer->vocab_size() : std::min<int64_t>(vocab, 256);
  const std::string cut =
      std::ssize(prompt) > window ? " (its last " + std::to_string(window) + " in the window)" : "";
  const std::string codec = tokenizer ? "tokenizer " + *tokenizer_path : "bytes";
  std::fprintf(stderr,
               "mantissa: sampling from %s (step %lld) on %s: a prompt of %zu token%s%s, %lld new, "
               "temperature %s, top-k %lld, top-p %s, seed %llu; %s\n",
               checkpoint_dir.c_str(), static_cast<long long>(step), device_name.c_str(),
               prompt.size(), prompt.size() == 1 ? "" : "s", cut.c_str(),
               static_cast<long long>(args.max_new_tokens), format_number(args.temperature).c_str(),
               static_cast<long long>(args.top_k), format_number(args.top_p).c_str(),
               static_cast<unsigned long long>(args.seed), codec.c_str());

  std::unique_ptr<models::Decoder> decoder;
  if (auto* llama = dynamic_cast<models::Llama*>(model.get())) {
    decoder = std::make_unique<models::LlamaDecoder>(*llama, *backend);
  } else {
    decoder = std::make_unique<models::GPT2Decoder>(dynamic_cast<models::GPT2&>(*model), *backend);
  }
  const auto start = std::chrono::steady_clock::now();
  TextStream stream(tokenizer ? &*tokenizer : nullptr, prompt, args.prompt);
  const std::vector<int32_t> generated = models::generate(
      *decoder, prompt, args.max_new_tokens, sampler, vocab_limit,
      [&](int32_t token) { stream.add(token); },
      tokenizer && args.stop_at_end_of_text ? tokenizer->eot() : -1);
  stream.finish();
  // Generation alone: the text's decoding and writing are left out.
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() -
      stream.seconds();
  std::fprintf(stderr, "mantissa: %zu tokens in %.2f s (%.1f tokens/s)\n", generated.size(),
               seconds, seconds > 0 ? static_cast<double>(generated.size()) / seconds : 0.0);
  return kExitOk;
}

}  // namespace

SampleArgs parse_sample_args(const std::vector<std::string>& args) {
  SampleArgs out;
  out.help = help_asked(args);
  if (out.help) return out;
  std::set<std::string> given;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const std::string name = arg.substr(0, arg.find('='));
    static const char* const kOptions[] = {
        "--run",   "--step",  "--prompt", "--max-new-tokens", "--temperature",
        "--top-k", "--top-p", "--seed",   "--end-of-text",    "--device"};
    if (std::find(std::begin(kOptions), std::end(kOptions), name) == std::end(kOptions)) {
      throw core::ConfigError("sample: unknown argument '" + arg + "'" + kUsage);
    }
    const std::string value = option_value(args, i, kUsage);
    require_given_once(given, name, kUsage);
    if (name == "--run") {
      out.run_dir = value;
    } else if (name == "--step") {
      out.step = parse_integer<int64_t>(name, value, 0);
    } else if (name == "--prompt") {
      out.prompt = value;
    } else if (name == "--max-new-tokens") {
      out.max_new_tokens = parse_integer<int64_t>(name, value, 0);
    } else if (name == "--top-k") {
      out.top_k = parse_integer<int64_t>(name, value, 0);
    } else if (name == "--seed") {
      out.seed = parse_integer<uint64_t>(name, value, 0);
    } else if (name == "--top-p") {
      const std::optional<double> top_p = finite_number(value);
      if (!top_p) bad_value(name, "'" + value + "'", "takes a number");
      out.top_p = *top_p;
      if (!(out.top_p > 0.0 && out.top_p <= 1.0)) {
        bad_value(name, value, "must lie in (0, 1] (1 draws among all tokens)");
      }
    } else if (name == "--temperature") {
      const std::optional<double> temperature = finite_number(value);
      if (!temperature) bad_value(name, "'" + value + "'", "takes a number");
      out.temperature = *temperature;
      if (out.temperature < 0.0) bad_value(name, value, "must be >= 0 (0 is greedy)");
    } else if (name == "--end-of-text") {
      if (value != "mark" && value != "stop")
        bad_value(name, "'" + value + "'", "takes mark or stop");
      out.stop_at_end_of_text = value == "stop";
    } else if (value == "AUTO" || value == "CPU" || value == "CUDA") {
      out.device = value;
    } else {
      bad_value(name, "'" + value + "'", "takes AUTO, CPU or CUDA");
    }
  }
  if (out.run_dir.empty()) throw core::ConfigError("sample needs --run DIR" + kUsage);
  return out;
}

int sample_command(int argc, char** argv) {
  try {
    const SampleArgs args = parse_sample_args(std::vector<std::string>(argv + 2, argv + argc));
    if (args.help) {
      std::fputs(kHelp, stdout);
      return kExitOk;
    }
    let_openmp_threads_sleep(argv);
    return run_sample(args);
  } catch (const std::exception& e) {
    return report_failure(e);
  }
}

}  // namespace mantissa::launcher
