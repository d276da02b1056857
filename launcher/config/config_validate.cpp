// Validation of a config with its defaults applied: one core::ConfigError per failed rule,
// "<path> = <value>: <rule>" (core/config_check.h). The options of the modules that run the config
// (loss scaler, FP8 scaling, AdamW, learning-rate schedule, data parallelism) are checked by the
// modules' own validate(), on the config's translation into them: this file only adds the config
// path to the field the module names. Everything else (run, model, data, checkpoint, metrics,
// debug, and rules across sections) is checked here.
#include <arpa/inet.h>
#include <glob.h>
#include <google/protobuf/descriptor.h>
#include <google/protobuf/message.h>
#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config_check.h"
#include "core/error.h"
#include "core/ops/cpu_switches.h"
#include "core/ops/flash_attention_switch.h"
#include "core/read_file.h"
#include "dist/mpi_watchdog.h"
#include "dist/progress_switch.h"
#include "launcher/config/config.h"
#include "launcher/config/config_translate.h"
#include "metrics/pushgateway_url.h"
#include "train/data/corpus.h"

namespace mantissa::launcher {

namespace {

namespace pb = google::protobuf;
using Config = TrainConfig;
using core::at_least;
using core::fits_float;
using core::in_range;
using core::in_unit_range;
using core::non_negative;

// A string value in a message: in quotes, with a newline or another control character written
// as an escape, so that the message stays one line.
std::string quoted(const std::string& s) {
  std::string text = "\"";
  for (const char c : s) {
    if (static_cast<unsigned char>(c) >= ' ') {
      text += c;
    } else if (c == '\n') {
      text += "\\n";
    } else {
      char escape[8];
      std::snprintf(escape, sizeof escape, "\\x%02x", static_cast<unsigned char>(c));
      text += escape;
    }
  }
  return text + "\"";
}

// Upper bounds on sizes, far beyond any model trained today, that keep every size the model
// and data code multiply together (tokens x channels, batch x heads x seq_len^2 for attention)
// inside int64: a value past them is a typo, which would otherwise end in an overflowed shape
// or a failed allocation that names no field.
constexpr int64_t kMaxWidth = int64_t{1} << 20;  // channels, hidden units, seq_len
constexpr int64_t kMaxLayers = int64_t{1} << 16;
constexpr int64_t kMaxHeads = int64_t{1} << 12;
constexpr int64_t kMaxMicroBatchTokens = int64_t{1} << 24;  // micro_batch_size x seq_len
using train::kMaxVocab;

void width(std::string_view path, int64_t value) {
  in_range(path, value, 1, kMaxWidth);
}

// A module's options are named by the module ("<section>.<field> = ...", the section being the
// options' own, e.g. "loss_scale.min"); `paths` maps each such section or field name to its
// path in the config ({"loss_scale", "precision.loss_scale"}). Runs `check` and rethrows its
// error under the config's name; a field the rule names as a bound ("must be at most
// lr_schedule.total_steps = 10") is renamed too, where `paths` maps that whole field.
template <typename Check>
void check_options(Check&& check,
                   std::initializer_list<std::pair<std::string_view, std::string_view>> paths) {
  try {
    check();
  } catch (const core::ConfigError& e) {
    const std::string_view message = e.what();
    for (const auto& [module_name, config_path] : paths) {
      if (!message.starts_with(module_name)) continue;
      std::string rest(message.substr(module_name.size()));
      if (!rest.starts_with('.') && !rest.starts_with(' ')) continue;
      for (const auto& [field, field_path] : paths) {
        if (field.find('.') == std::string_view::npos) continue;  // a section, not a field
        const std::string bound = std::string(field) + " = ";
        for (size_t at = rest.find(bound); at != std::string::npos;
             at = rest.find(bound, at + field_path.size())) {
          rest.replace(at, field.size(), field_path);
        }
      }
      throw core::ConfigError(std::string(config_path) + rest);
    }
    throw;
  }
}

// Where a relative path that names nothing was looked for: a config's paths are taken from the
// directory mantissa runs in, not from the config file's.
std::string looked_for_in(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path here = std::filesystem::current_path(ec);
  if (!std::filesystem::path(path).is_relative() || ec) return "";
  return " (relative paths are taken from the current directory, " + here.string() + ")";
}

void check_readable_file(std::string_view field, const std::string& path) {
  require(!path.empty(), field, quoted(path), "must name a file");
  // Before it is opened: opening a named pipe waits for a writer, for ever (deaf to SIGTERM,
  // whose handler only sets a flag).
  const std::string not_a_file = core::not_a_file_reason(path);
  require(not_a_file.empty(), field, quoted(path), not_a_file);
  std::ifstream in(path, std::ios::binary);
  const int error = errno;
  require(in.good(), field, quoted(path),
          std::string("cannot be read: ") + std::strerror(error) +
              (error == ENOENT ? looked_for_in(path) : ""));
}

// The files `pattern` matches (at least one, none a directory).
std::vector<std::string> check_glob(std::string_view field, const std::string& pattern) {
  require(!pattern.empty(), field, quoted(pattern), "must be a glob of token shard files");
  glob_t matches{};
  // GLOB_MARK ends every directory it matches with '/': shards are files.
  const int rc = glob(pattern.c_str(), GLOB_MARK, nullptr, &matches);
  std::vector<std::string> files;
  std::string directory;
  for (size_t i = 0; rc == 0 && i < matches.gl_pathc && directory.empty(); ++i) {
    const std::string match = matches.gl_pathv[i];
    if (match.ends_with('/')) directory = match;
    files.push_back(match);
  }
  globfree(&matches);
  require(rc == 0, field, quoted(pattern), "matches no file" + looked_for_in(pattern));
  require(directory.empty(), field, quoted(pattern),
          "matches the directory " + directory + ": a glob of token shard files must match files");
  return files;
}

// A validation shard that is also a training shard (`tokenize encode` writes train_*.bin and
// val_*.bin side by side, and "dir/*.bin" takes both) would make val_loss the loss on trained
// tokens. Compared as files (device and inode), so two spellings of one path are one file.
void check_no_shared_shard(const std::vector<std::string>& train,
                           const std::vector<std::string>& val, const Config::Data& data) {
  const auto identity = [](const std::string& path) -> std::optional<std::pair<dev_t, ino_t>> {
    struct stat st {};
    if (stat(path.c_str(), &st) != 0) return std::nullopt;  // the corpus's checks report it
    return std::pair{st.st_dev, st.st_ino};
  };
  std::set<std::pair<dev_t, ino_t>> train_files;
  for (const std::string& path : train) {
    if (const auto id = identity(path)) train_files.insert(*id);
  }
  for (const std::string& path : val) {
    const auto id = identity(path);
    require(!id || !train_files.contains(*id), "data.token_shards.val_pattern",
            quoted(data.token_shards().val_pattern()),
            "matches " + path +
                ", which data.token_shards.pattern = " + quoted(data.token_shards().pattern()) +
                " matches too: the run would be evaluated on tokens it trains on (tokenize "
                "encode writes train_*.bin and val_*.bin: give each its own glob)");
  }
}

void check_data_files(const Config::Data& data) {
  if (data.has_text_file()) check_readable_file("data.text_file.path", data.text_file().path());
  if (data.has_token_shards()) {
    const std::vector<std::string> train =
        check_glob("data.token_shards.pattern", data.token_shards().pattern());
    const std::string& val = data.token_shards().val_pattern();
    if (!val.empty()) {
      check_no_shared_shard(train, check_glob("data.token_shards.val_pattern", val), data);
    }
  }
  if (!data.tokenizer().empty()) check_readable_file("data.tokenizer", data.tokenizer());
}

void validate_llama(const Config::Model::Llama& m) {
  in_range("model.llama.n_layer", m.n_layer(), 1, kMaxLayers);
  in_range("model.llama.n_head", m.n_head(), 1, kMaxHeads);
  in_range("model.llama.n_kv_head", m.n_kv_head(), 1, kMaxHeads);
  width("model.llama.n_embd", m.n_embd());
  const std::string n_head = std::to_string(m.n_head());
  require(m.n_embd() % m.n_head() == 0, "model.llama.n_embd", std::to_string(m.n_embd()),
          "must be a multiple of model.llama.n_head = " + n_head);
  const int64_t head_dim = m.n_embd() / m.n_head();
  require(head_dim % 2 == 0, "model.llama.n_embd", std::to_string(m.n_embd()),
          "divided by model.llama.n_head = " + n_head + " gives the head dimension " +
              std::to_string(head_dim) + ", which must be even (RoPE rotates channel pairs)");
  require(m.n_head() % m.n_kv_head() == 0, "model.llama.n_kv_head", std::to_string(m.n_kv_head()),
          "must divide model.llama.n_head = " + n_head);
  width("model.llama.ffn_hidden", m.ffn_hidden());
  width("model.llama.seq_len", m.seq_len());
  in_range("model.llama.vocab_size", m.vocab_size(), 1, kMaxVocab);
  require(std::isfinite(m.rope_theta()) && m.rope_theta() > 1.0, "model.llama.rope_theta",
          format_number(m.rope_theta()), "must be finite and > 1");
  fits_float("model.llama.rope_theta", m.rope_theta());  // the RoPE table rounds it to a float
  require(std::isfinite(m.norm_eps()) && m.norm_eps() > 0.0, "model.llama.norm_eps",
          format_number(m.norm_eps()), "must be finite and > 0");
  fits_float("model.llama.norm_eps", m.norm_eps());
}

// A safetensors file is read only as part of a Hugging Face directory: of a file of one
// (config.json beside it), the directory is what to name.
void check_not_a_loose_safetensors_file(const std::string& init) {
  std::filesystem::path directory = std::filesystem::path(init).parent_path();
  if (directory.empty()) directory = ".";
  std::error_code ec;
  const bool in_hf_directory = std::filesystem::is_regular_file(directory / "config.json", ec);
  require(!init.ends_with(".safetensors"), "model.init_from", quoted(init),
          in_hf_directory ? "is a file of the Hugging Face directory " + directory.string() +
                                ": name the directory"
                          : "a safetensors file is read only as part of a Hugging Face directory "
                            "(config.json beside model.safetensors, as `mantissa export --format "
                            "hf` writes); otherwise give an llm.c model file");
}

}  // namespace

void check_initial_weights(const Config::Model& model) {
  const std::string& init = model.init_from();
  std::error_code ec;
  if (!init.empty() && std::filesystem::is_directory(init, ec)) {
    // A Hugging Face model directory (launcher/hf_weights.h); its contents are checked when
    // it is read.
    require(!model.has_mlp(), "model.init_from", quoted(init),
            "is a Hugging Face model directory, which needs model.gpt2 or model.llama");
    // The weights: model.safetensors, or else the index of its shards.
    const std::filesystem::path dir(init);
    const bool sharded = !std::filesystem::exists(dir / "model.safetensors", ec) &&
                         std::filesystem::exists(dir / "model.safetensors.index.json", ec);
    for (const char* file :
         {sharded ? "model.safetensors.index.json" : "model.safetensors", "config.json"})
      check_readable_file("model.init_from", (dir / file).string());
  } else if (!init.empty()) {
    // Readable first: a Hugging Face directory that is gone is no llm.c file of the wrong model.
    check_readable_file("model.init_from", init);
    check_not_a_loose_safetensors_file(init);
    require(model.has_gpt2(), "model.init_from", quoted(init),
            "needs model.gpt2 (llm.c model files hold GPT-2 weights; Llama weights come from a "
            "Hugging Face model directory)");
  }
}

namespace {

ModelShape validate_model(const Config::Model& model) {
  if (model.has_mlp()) {
    const Config::Model::MLP& m = model.mlp();
    width("model.mlp.n_embd", m.n_embd());
    width("model.mlp.hidden", m.hidden());
    width("model.mlp.seq_len", m.seq_len());
    in_range("model.mlp.vocab_size", m.vocab_size(), 1, kMaxVocab);
    return model_shape(model);
  }
  if (model.has_llama()) {
    validate_llama(model.llama());
    return model_shape(model);
  }
  const Config::Model::GPT2& g = model.gpt2();
  in_range("model.gpt2.n_layer", g.n_layer(), 1, kMaxLayers);
  in_range("model.gpt2.n_head", g.n_head(), 1, kMaxHeads);
  width("model.gpt2.n_embd", g.n_embd());
  require(g.n_embd() % g.n_head() == 0, "model.gpt2.n_embd", std::to_string(g.n_embd()),
          "must be a multiple of model.gpt2.n_head = " + std::to_string(g.n_head()));
  width("model.gpt2.seq_len", g.seq_len());
  in_range("model.gpt2.vocab_size", g.vocab_size(), 1, kMaxVocab);
  return model_shape(model);
}

void validate_data(const Config::Data& data, const ModelShape& model, DataFiles files) {
  if (data.has_synthetic()) {
    // Generated in memory, as text and then tokens: 2^31 tokens take about 6 GB.
    constexpr int64_t kMaxSyntheticTokens = int64_t{1} << 31;
    const auto synthetic_tokens = [&](const char* field, int64_t n, bool none_allowed) {
      require((none_allowed && n == 0) || (n > model.seq_len && n <= kMaxSyntheticTokens), field,
              std::to_string(n),
              std::string(none_allowed ? "must be 0 (none) or " : "must ") + "lie in [" +
                  model.prefix + ".seq_len + 1 = " + std::to_string(model.seq_len + 1) + ", " +
                  std::to_string(kMaxSyntheticTokens) +
                  "] (a window of seq_len + 1 tokens at least; generated in memory)");
    };
    synthetic_tokens("data.synthetic.n_tokens", data.synthetic().n_tokens(), false);
    synthetic_tokens("data.synthetic.val_tokens", data.synthetic().val_tokens(), true);
  }
  if (!data.has_token_shards()) {
    const char* source = data.has_text_file() ? "data.text_file" : "data.synthetic";
    require(model.vocab_size >= 256, model.prefix + ".vocab_size", std::to_string(model.vocab_size),
            std::string("must be >= 256, the byte vocabulary of ") + source);
  }
  if (data.has_text_file()) {
    in_unit_range("data.text_file.val_fraction", data.text_file().val_fraction(), true);
  }
  at_least("data.micro_batch_size", data.micro_batch_size(), 1);
  require(data.micro_batch_size() <= kMaxMicroBatchTokens / model.seq_len, "data.micro_batch_size",
          std::to_string(data.micro_batch_size()),
          "times " + model.prefix + ".seq_len = " + std::to_string(model.seq_len) +
              " must be at most " + std::to_string(kMaxMicroBatchTokens) +
              " tokens per micro-batch");
  in_range("data.grad_accum_steps", data.grad_accum_steps(), 1, kMaxWidth);
  if (files == DataFiles::kCheck) check_data_files(data);
}

// Evaluation reads whole windows of seq_len + 1 tokens from the validation set.
void validate_eval(const TrainConfig& config, const ModelShape& model) {
  const Config::Run& run = config.run();
  at_least("run.eval_every", run.eval_every(), 0);
  if (run.eval_every() == 0) return;
  require(has_validation_data(config.data()), "run.eval_every", std::to_string(run.eval_every()),
          "needs a validation set (data.synthetic.val_tokens, data.text_file.val_fraction or "
          "data.token_shards.val_pattern), or 0 to turn evaluation off");
  require(run.eval_tokens() >= model.seq_len, "run.eval_tokens", std::to_string(run.eval_tokens()),
          "must be >= " + model.prefix + ".seq_len = " + std::to_string(model.seq_len) +
              " (one window)");
}

// FP8_HYBRID runs every Linear layer's three GEMMs in FP8. Their K are the layers' input
// widths (forward), output widths (input gradient) and the tokens of a micro-batch (weight
// gradient). FP8 GEMMs read rows of whole 16 bytes (core/ops/gemm_checks.h), and the block
// recipes scale whole blocks along K: every K must be a multiple of 128 for BLOCKWISE and of
// 32 for MXFP8 (a block cut short would still run, but it is not the recipe's block: such
// shapes are refused, not padded); the rows of their GEMMs are then multiples of 8 too, as
// 1x128 and 128x128 scales need (core::scale_rows_multiple). Checked here, so that a model that
// trains on the CPU does not stop at its first GEMM on a GPU.
void validate_fp8_shapes(const TrainConfig& config) {
  if (config.precision().mode() != Config::Precision::FP8_HYBRID) return;
  const Config::Precision::Fp8::Recipe recipe = config.precision().fp8().recipe();
  const int64_t block = recipe == Config::Precision::Fp8::BLOCKWISE ? 128
                        : recipe == Config::Precision::Fp8::MXFP8   ? 32
                                                                    : 16;
  const std::string rule =
      "must be a multiple of " + std::to_string(block) + " with precision.mode = FP8_HYBRID" +
      (block == 16 ? std::string()
                   : " and precision.fp8.recipe = " + Config::Precision::Fp8::Recipe_Name(recipe));
  const std::string why = block == 16 ? " (FP8 GEMMs read 16-byte rows)"
                                      : " (the K of its FP8 GEMMs must be whole " +
                                            std::to_string(block) + "-element scale blocks)";
  const auto multiple = [&](const std::string& path, int64_t value) {
    require(value % block == 0, path, std::to_string(value), rule + why);
  };
  const Config::Model& model = config.model();
  int64_t seq_len = 0;
  std::string seq_len_path;
  if (model.has_mlp()) {
    multiple("model.mlp.n_embd", model.mlp().n_embd());
    multiple("model.mlp.hidden", model.mlp().hidden());
    multiple("model.mlp.vocab_size", model.mlp().vocab_size());
    seq_len = model.mlp().seq_len();
    seq_len_path = "model.mlp.seq_len";
  } else if (model.has_llama()) {
    const Config::Model::Llama& m = model.llama();
    multiple("model.llama.n_embd", m.n_embd());
    multiple("model.llama.ffn_hidden", m.ffn_hidden());
    const int64_t kv_width = 2 * m.n_kv_head() * (m.n_embd() / m.n_head());
    require(kv_width % block == 0, "model.llama.n_kv_head", std::to_string(m.n_kv_head()),
            "times 2 head dimensions (" + std::to_string(kv_width) +
                ", the k and v rows of the fused q|k|v projection) " + rule + why);
    seq_len = m.seq_len();
    seq_len_path = "model.llama.seq_len";
  } else {
    multiple("model.gpt2.n_embd", model.gpt2().n_embd());
    seq_len = model.gpt2().seq_len();
    seq_len_path = "model.gpt2.seq_len";
  }
  const int64_t tokens = config.data().micro_batch_size() * seq_len;
  require(tokens % block == 0, "data.micro_batch_size",
          std::to_string(config.data().micro_batch_size()),
          "times " + seq_len_path + " = " + std::to_string(seq_len) + " (" +
              std::to_string(tokens) + " tokens) " + rule +
              " (the tokens are the K of the FP8 weight-gradient GEMMs)");
}

// The schedule's options come from two sections, and its total_steps is run.steps (whose rule,
// >= 1, is thus the schedule's): its fields are renamed one by one.
void validate_optimizer(const TrainConfig& config) {
  check_options([&] { core::validate(lr_schedule_config(config)); },
                {{"lr_schedule.total_steps", "run.steps"},
                 {"lr_schedule.lr", "optimizer.adamw.lr"},
                 {"lr_schedule.warmup_steps", "optimizer.warmup_steps"},
                 {"lr_schedule.min_lr_ratio", "optimizer.min_lr_ratio"}});
  // AdamW keeps its settings as floats: each is checked as written, then as the float it becomes
  // (a message must name the value the user wrote, not 1 for a beta of 0.99999999999).
  const Config::Optimizer::AdamW& adamw = config.optimizer().adamw();
  for (const auto& [path, beta] : {std::pair{"optimizer.adamw.beta1", adamw.beta1()},
                                   std::pair{"optimizer.adamw.beta2", adamw.beta2()}}) {
    in_unit_range(path, beta, true);
    require(static_cast<float>(beta) < 1.0f, path, core::format_number(beta),
            "rounds to 1 as a float, which AdamW keeps it as: at most " +
                core::format_number(std::nextafter(1.0f, 0.0f)));
  }
  core::positive("optimizer.adamw.eps", adamw.eps());
  fits_float("optimizer.adamw.eps", adamw.eps());
  non_negative("optimizer.adamw.weight_decay", adamw.weight_decay());
  fits_float("optimizer.adamw.weight_decay", adamw.weight_decay());
  check_options([&] { core::validate(adamw_config(config)); }, {{"adamw", "optimizer.adamw"}});
  non_negative("optimizer.grad_clip", config.optimizer().grad_clip());
  fits_float("optimizer.grad_clip", config.optimizer().grad_clip());
}

// Every field is checked, also those the chosen mode ignores (the modules' rule).
void validate_precision(const TrainConfig& config) {
  check_options([&] { core::validate(loss_scaler_config(config)); },
                {{"loss_scale", "precision.loss_scale"}});
  check_options([&] { core::validate(fp8_scaling_config(config)); }, {{"fp8", "precision.fp8"}});
}

// Proto3 enums are open: a config file's `mode: 7` parses, and would run as whatever the
// translation's default branch makes of it (FP32 for precision.mode). Every enum field set
// must hold a value its enum names (--set already refuses others).
void validate_enum_values(const pb::Message& message, const std::string& prefix) {
  const pb::Reflection& reflection = *message.GetReflection();
  std::vector<const pb::FieldDescriptor*> fields;
  reflection.ListFields(message, &fields);
  for (const pb::FieldDescriptor* field : fields) {
    const std::string path = prefix + field->name();
    const int count = field->is_repeated() ? reflection.FieldSize(message, field) : 1;
    for (int i = 0; i < count; ++i) {
      const std::string where = field->is_repeated() ? path + "[" + std::to_string(i) + "]" : path;
      if (field->type() == pb::FieldDescriptor::TYPE_MESSAGE) {
        validate_enum_values(field->is_repeated() ? reflection.GetRepeatedMessage(message, field, i)
                                                  : reflection.GetMessage(message, field),
                             where + ".");
      } else if (field->type() == pb::FieldDescriptor::TYPE_ENUM) {
        const int value = field->is_repeated() ? reflection.GetRepeatedEnumValue(message, field, i)
                                               : reflection.GetEnumValue(message, field);
        const pb::EnumDescriptor& type = *field->enum_type();
        std::string names;
        for (int v = 0; v < type.value_count(); ++v)
          names += (v > 0 ? ", " : "") + type.value(v)->name();
        require(type.FindValueByNumber(value) != nullptr, where, std::to_string(value),
                "is none of " + names);
      }
    }
  }
}

void validate_metrics(const Config::Metrics& m) {
  require(!m.bind_address().empty(), "metrics.bind_address", quoted(m.bind_address()),
          "must be an address to listen on, e.g. 127.0.0.1 or 0.0.0.0");
  in_range("metrics.port", m.port(), 0, 65535);
  in_addr address{};
  require(m.port() == 0 || inet_pton(AF_INET, m.bind_address().c_str(), &address) == 1,
          "metrics.bind_address", quoted(m.bind_address()),
          "must be an IPv4 address to listen on, e.g. 127.0.0.1 or 0.0.0.0 (not a host name)");
  if (const std::string& url = m.pushgateway_url(); !url.empty()) {
    const std::string problem = metrics::parse_pushgateway_url(url).problem;
    require(problem.empty(), "metrics.pushgateway_url", quoted(url), problem);
  }
  in_range("metrics.push_every", m.push_every(), 1, INT32_MAX);
  non_negative("metrics.peak_tflops", m.peak_tflops());
  // One segment of the Pushgateway's URL path (/metrics/job/<job>/rank/<rank>).
  const std::string& job = m.job();
  const bool plain = !job.empty() && std::all_of(job.begin(), job.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '.' || c == ':' || c == '-';
  });
  require(plain, "metrics.job", quoted(job),
          "must be a name of letters, digits and _ . : - (the Pushgateway's job label)");
  // A URL's dot segments: the client would remove them, and push to another path.
  require(job != "." && job != "..", "metrics.job", quoted(job),
          "must not be . or .. (a URL would drop it from the push's path)");
}

void validate_debug(const Config::Debug& d, int64_t steps) {
  at_least("debug.inject_nonfinite_rank", d.inject_nonfinite_rank(), 0);
  for (int i = 0; i < d.inject_nonfinite_steps_size(); ++i) {
    in_range("debug.inject_nonfinite_steps[" + std::to_string(i) + "]", d.inject_nonfinite_steps(i),
             0, steps - 1);
  }
}

}  // namespace

// Checked before anything runs, not at the first GEMM, cast or attention that reads a switch.
void validate_environment() {
  try {
    core::check_cpu_switches();
    core::check_flash_attention_switch();
    dist::mpi_progress_thread_on();
    dist::mpi_start_timeout_s();
  } catch (const core::ConfigError&) {
    throw;
  } catch (const core::Error& e) {
    throw core::ConfigError(std::string("environment: ") + e.what());
  }
}

void validate(const TrainConfig& config, DataFiles files) {
  validate_enum_values(config, "");
  const Config::Run& run = config.run();
  at_least("run.log_every", run.log_every(), 1);
  require(!run.dir().empty(), "run.dir", quoted(run.dir()), "must name a directory");
  const std::filesystem::path run_dir = std::filesystem::path(run.dir()).lexically_normal();
  require(!run_dir.has_root_directory() || !run_dir.relative_path().empty(), "run.dir",
          quoted(run.dir()),
          "is the file system's root: name a directory of the run's own (an unset variable "
          "before a slash, as in run.dir=$DIR/, gives this)");

  const ModelShape model = validate_model(config.model());
  validate_data(config.data(), model, files);
  validate_eval(config, model);
  validate_optimizer(config);  // run.steps too: it is the schedule's total
  validate_precision(config);
  validate_fp8_shapes(config);
  dist::validate(dist_config(config));

  at_least("checkpoint.every_steps", config.checkpoint().every_steps(), 0);
  at_least("checkpoint.keep", config.checkpoint().keep(), 0);
  validate_metrics(config.metrics());
  validate_debug(config.debug(), run.steps());
  validate_environment();
}

void validate_for_world(const TrainConfig& config, int world_size, int local_rank) {
  const TrainConfig::Debug& debug = config.debug();
  if (debug.inject_nonfinite_steps_size() > 0) {
    require(debug.inject_nonfinite_rank() < world_size, "debug.inject_nonfinite_rank",
            std::to_string(debug.inject_nonfinite_rank()),
            "must be < the world size " + std::to_string(world_size));
  }
  const int port = config.metrics().port();
  require(port == 0 || port + local_rank <= 65535, "metrics.port", std::to_string(port),
          "plus the local rank " + std::to_string(local_rank) + " must be <= 65535");
}

}  // namespace mantissa::launcher
