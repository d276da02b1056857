#include "launcher/config.h"

#include <glob.h>
#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/ops/cpu/cpu_switch.h"

namespace mantissa::launcher {

namespace {

namespace pb = google::protobuf;
using Config = TrainConfig;

// ---------------------------------------------------------------------------------------------
// Defaults. Applied through the same reflection as --set, to fields that are still unset, so
// the table reads like a config file. Two defaults depend on other fields and are applied in
// apply_defaults itself: precision.loss_scale.mode (DYNAMIC for FP16, NONE otherwise) and
// run.dir (runs/<config file name>).

constexpr std::pair<std::string_view, std::string_view> kDefaults[] = {
    {"run.steps", "1000"},
    {"run.seed", "1"},
    {"run.device", "AUTO"},
    {"run.log_every", "10"},
    {"model.gpt2.n_layer", "6"},
    {"model.gpt2.n_head", "6"},
    {"model.gpt2.n_embd", "384"},
    {"model.gpt2.seq_len", "256"},
    {"model.gpt2.vocab_size", "256"},
    {"model.mlp.n_embd", "64"},
    {"model.mlp.hidden", "256"},
    {"model.mlp.seq_len", "64"},
    {"model.mlp.vocab_size", "256"},
    {"model.init_from", ""},
    {"data.synthetic.n_tokens", "2097152"},
    {"data.micro_batch_size", "8"},
    {"data.grad_accum_steps", "1"},
    {"optimizer.adamw.lr", "0.0006"},
    {"optimizer.adamw.beta1", "0.9"},
    {"optimizer.adamw.beta2", "0.95"},
    {"optimizer.adamw.eps", "1e-08"},
    {"optimizer.adamw.weight_decay", "0.1"},
    {"optimizer.grad_clip", "1"},
    {"optimizer.warmup_steps", "0"},
    {"optimizer.min_lr_ratio", "0"},
    {"precision.mode", "BF16"},
    {"precision.loss_scale.init", "65536"},
    {"precision.loss_scale.growth_factor", "2"},
    {"precision.loss_scale.backoff_factor", "0.5"},
    {"precision.loss_scale.growth_interval", "2000"},
    {"precision.loss_scale.hysteresis", "2"},
    {"precision.loss_scale.min", "1"},
    {"precision.loss_scale.max", "16777216"},
    {"precision.loss_scale.max_overflows_at_min", "10"},
    {"precision.fp8.recipe", "DELAYED"},
    {"precision.fp8.amax_history_len", "1024"},
    {"precision.fp8.amax_compute", "MAX"},
    {"precision.fp8.margin", "0"},
    {"dist.backend", "AUTO"},
    {"dist.grad_reduce_dtype", "BF16"},
    {"dist.accumulate_fp32", "false"},
    {"dist.bucket_mb", "25"},
    {"dist.overlap", "true"},
    {"dist.zero_stage", "0"},
    {"dist.timeout_s", "300"},
    {"dist.consistency_check_every", "100"},
    {"checkpoint.every_steps", "1000"},
    {"checkpoint.keep", "3"},
    {"checkpoint.resume", "AUTO"},
    {"metrics.bind_address", "127.0.0.1"},
    {"metrics.port", "0"},
    {"metrics.pushgateway_url", ""},
    {"metrics.push_every", "10"},
    {"metrics.peak_tflops", "0"},
    {"debug.inject_nonfinite_rank", "0"},
};

// ---------------------------------------------------------------------------------------------
// Text format parsing.

// Keeps the parser's first error (the rest are usually consequences of it).
class FirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (!message_.empty()) return;
    line_ = line;
    column_ = column;
    message_ = message;
  }
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}

  // "<source>:<line>:<column>: <message>", 1-based as editors count.
  std::string describe(const std::string& source) const {
    std::ostringstream out;
    out << source;
    if (line_ >= 0) out << ":" << line_ + 1 << ":" << column_ + 1;
    out << ": " << (message_.empty() ? "cannot parse" : message_);
    return out.str();
  }

 private:
  int line_ = -1;
  pb::io::ColumnNumber column_ = 0;
  std::string message_;
};

void parse_text(std::string_view text, const std::string& source, pb::Message& out) {
  FirstError errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &out))
    throw core::ConfigError(errors.describe(source));
}

// ---------------------------------------------------------------------------------------------
// Field paths through reflection.

std::string field_names(const pb::Descriptor& type) {
  std::string names;
  for (int i = 0; i < type.field_count(); ++i) {
    names += (i ? ", " : "") + type.field(i)->name();
  }
  return names;
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

struct FieldRef {
  pb::Message* message = nullptr;  // holds the field
  const pb::FieldDescriptor* field = nullptr;
};

// Walks `path` from `root`. Intermediate messages are created as needed, which for a oneof
// member selects it; with `skip_unselected_oneof` a path through an unselected oneof member
// resolves to nothing instead (defaults apply only to the model and data source in use).
FieldRef resolve(pb::Message& root, std::string_view path, bool skip_unselected_oneof) {
  const std::vector<std::string_view> parts = split_path(path);
  pb::Message* message = &root;
  std::string walked;
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::Descriptor& type = *message->GetDescriptor();
    const pb::FieldDescriptor* field = type.FindFieldByName(std::string(parts[i]));
    const std::string where = walked.empty() ? "TrainConfig" : walked;
    if (field == nullptr) {
      throw core::ConfigError(where + " has no field '" + std::string(parts[i]) +
                              "' (fields: " + field_names(type) + ")");
    }
    walked += (walked.empty() ? "" : ".") + field->name();
    if (i + 1 == parts.size()) return {message, field};
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE || field->is_repeated()) {
      throw core::ConfigError(walked + " is a value, not a message with fields");
    }
    const pb::Reflection& reflection = *message->GetReflection();
    if (skip_unselected_oneof && field->containing_oneof() != nullptr &&
        !reflection.HasField(*message, field)) {
      return {};
    }
    message = reflection.MutableMessage(message, field);
  }
  return {};
}

template <typename T>
T parse_integer(std::string_view text, const pb::FieldDescriptor& field) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) {
    throw core::ConfigError("value '" + std::string(text) + "' does not fit " + field.name() +
                            " (" + field.type_name() + ", " +
                            std::to_string(std::numeric_limits<T>::min()) + " to " +
                            std::to_string(std::numeric_limits<T>::max()) + ")");
  }
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw core::ConfigError(field.name() + " takes an integer (" + field.type_name() + "), got '" +
                            std::string(text) + "'");
  }
  return value;
}

double parse_double(std::string_view text, const pb::FieldDescriptor& field) {
  double value = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw core::ConfigError(field.name() + " takes a number, got '" + std::string(text) + "'");
  }
  return value;
}

// Sets (or, for a repeated field, appends) one value given as text.
void set_from_text(pb::Message& message, const pb::FieldDescriptor& field, std::string_view text) {
  const pb::Reflection& r = *message.GetReflection();
  const bool add = field.is_repeated();
  switch (field.cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32: {
      const auto v = parse_integer<int32_t>(text, field);
      add ? r.AddInt32(&message, &field, v) : r.SetInt32(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_INT64: {
      const auto v = parse_integer<int64_t>(text, field);
      add ? r.AddInt64(&message, &field, v) : r.SetInt64(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_UINT32: {
      const auto v = parse_integer<uint32_t>(text, field);
      add ? r.AddUInt32(&message, &field, v) : r.SetUInt32(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      const auto v = parse_integer<uint64_t>(text, field);
      add ? r.AddUInt64(&message, &field, v) : r.SetUInt64(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
      const double v = parse_double(text, field);
      add ? r.AddDouble(&message, &field, v) : r.SetDouble(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      const auto v = static_cast<float>(parse_double(text, field));
      add ? r.AddFloat(&message, &field, v) : r.SetFloat(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL: {
      if (text != "true" && text != "false") {
        throw core::ConfigError(field.name() + " takes true or false, got '" + std::string(text) +
                                "'");
      }
      add ? r.AddBool(&message, &field, text == "true")
          : r.SetBool(&message, &field, text == "true");
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumDescriptor& type = *field.enum_type();
      const pb::EnumValueDescriptor* v = type.FindValueByName(std::string(text));
      if (v == nullptr) {
        std::string names;
        for (int i = 0; i < type.value_count(); ++i)
          names += (i ? ", " : "") + type.value(i)->name();
        throw core::ConfigError(field.name() + " must be one of " + names + ", got '" +
                                std::string(text) + "'");
      }
      add ? r.AddEnum(&message, &field, v) : r.SetEnum(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      add ? r.AddString(&message, &field, std::string(text))
          : r.SetString(&message, &field, std::string(text));
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE: {
      // A message body in text format, with or without its braces: "{}", "{n_embd: 32}".
      std::string_view body = text;
      if (body.size() >= 2 && body.front() == '{' && body.back() == '}') {
        body = body.substr(1, body.size() - 2);
      }
      pb::Message* target =
          add ? r.AddMessage(&message, &field) : r.MutableMessage(&message, &field);
      parse_text(body, field.name() + " value", *target);
      return;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Validation helpers: one line per failed rule, "<path> = <value>: <rule>".

std::string quoted(const std::string& s) {
  return "\"" + s + "\"";
}

void at_least(std::string_view path, int64_t value, int64_t min) {
  require(value >= min, path, std::to_string(value), "must be >= " + std::to_string(min));
}

void in_range(std::string_view path, int64_t value, int64_t min, int64_t max) {
  require(value >= min && value <= max, path, std::to_string(value),
          "must lie in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

void positive(std::string_view path, double value) {
  require(std::isfinite(value) && value > 0.0, path, format_number(value), "must be > 0");
}

void non_negative(std::string_view path, double value) {
  require(std::isfinite(value) && value >= 0.0, path, format_number(value), "must be >= 0");
}

// Half-open [min, max) when `max_open`, else closed.
void in_unit_range(std::string_view path, double value, bool max_open) {
  const bool ok = value >= 0.0 && (max_open ? value < 1.0 : value <= 1.0);
  require(ok, path, format_number(value), max_open ? "must lie in [0, 1)" : "must lie in [0, 1]");
}

void check_readable_file(std::string_view field, const std::string& path) {
  require(!path.empty(), field, quoted(path), "must name a file");
  std::error_code ec;  // the overload that throws would turn odd paths into a crash
  require(!std::filesystem::is_directory(path, ec), field, quoted(path),
          "is a directory, not a file");
  std::ifstream in(path, std::ios::binary);
  require(in.good(), field, quoted(path), std::string("cannot be read: ") + std::strerror(errno));
}

void check_data_files(const Config::Data& data) {
  if (data.has_text_file()) check_readable_file("data.text_file.path", data.text_file().path());
  if (data.has_token_shards()) {
    const std::string& pattern = data.token_shards().pattern();
    require(!pattern.empty(), "data.token_shards.pattern", quoted(pattern),
            "must be a glob of token shard files");
    glob_t matches{};
    const int rc = glob(pattern.c_str(), 0, nullptr, &matches);
    globfree(&matches);
    require(rc == 0, "data.token_shards.pattern", quoted(pattern), "matches no file");
  }
}

// The model's sequence length and vocabulary, whichever architecture it is.
struct ModelShape {
  std::string prefix;  // "model.gpt2" or "model.mlp"
  int64_t seq_len = 0;
  int64_t vocab_size = 0;
};

ModelShape validate_model(const Config::Model& model) {
  const std::string& init = model.init_from();
  if (!init.empty()) {
    require(model.has_gpt2(), "model.init_from", quoted(init),
            "needs model.gpt2 (llm.c model files hold GPT-2 weights)");
    check_readable_file("model.init_from", init);
  }
  if (model.has_mlp()) {
    const Config::Model::MLP& m = model.mlp();
    at_least("model.mlp.n_embd", m.n_embd(), 1);
    at_least("model.mlp.hidden", m.hidden(), 1);
    at_least("model.mlp.seq_len", m.seq_len(), 1);
    in_range("model.mlp.vocab_size", m.vocab_size(), 1, 65536);
    return {"model.mlp", m.seq_len(), m.vocab_size()};
  }
  const Config::Model::GPT2& g = model.gpt2();
  at_least("model.gpt2.n_layer", g.n_layer(), 1);
  at_least("model.gpt2.n_head", g.n_head(), 1);
  at_least("model.gpt2.n_embd", g.n_embd(), 1);
  require(g.n_embd() % g.n_head() == 0, "model.gpt2.n_embd", std::to_string(g.n_embd()),
          "must be a multiple of model.gpt2.n_head = " + std::to_string(g.n_head()));
  at_least("model.gpt2.seq_len", g.seq_len(), 1);
  // Token shards store uint16 tokens, so no vocabulary beyond 2^16 can be fed.
  in_range("model.gpt2.vocab_size", g.vocab_size(), 1, 65536);
  return {"model.gpt2", g.seq_len(), g.vocab_size()};
}

void validate_data(const Config::Data& data, const ModelShape& model) {
  if (data.has_synthetic()) {
    require(data.synthetic().n_tokens() > model.seq_len, "data.synthetic.n_tokens",
            std::to_string(data.synthetic().n_tokens()),
            "must be > " + model.prefix + ".seq_len = " + std::to_string(model.seq_len));
  }
  if (!data.has_token_shards()) {
    const char* source = data.has_text_file() ? "data.text_file" : "data.synthetic";
    require(model.vocab_size >= 256, model.prefix + ".vocab_size", std::to_string(model.vocab_size),
            std::string("must be >= 256, the byte vocabulary of ") + source);
  }
  at_least("data.micro_batch_size", data.micro_batch_size(), 1);
  at_least("data.grad_accum_steps", data.grad_accum_steps(), 1);
  check_data_files(data);
}

// FP8_HYBRID runs every Linear layer's three GEMMs in FP8, which read rows of whole 16 bytes
// (core/ops/gemm_checks.h): the layers' widths are the K of one GEMM or the rows of another's
// output, and the tokens of a micro-batch are the K of the weight gradient. Checked here, so
// that a model that trains on the CPU does not stop at its first GEMM on a GPU.
void validate_fp8_shapes(const TrainConfig& config) {
  if (config.precision().mode() != Config::Precision::FP8_HYBRID) return;
  const std::string rule = "must be a multiple of 16 with precision.mode = FP8_HYBRID";
  const auto multiple_of_16 = [&](const std::string& path, int64_t value) {
    require(value % 16 == 0, path, std::to_string(value), rule + " (FP8 GEMMs read 16-byte rows)");
  };
  const Config::Model& model = config.model();
  int64_t seq_len = 0;
  std::string seq_len_path;
  if (model.has_mlp()) {
    multiple_of_16("model.mlp.n_embd", model.mlp().n_embd());
    multiple_of_16("model.mlp.hidden", model.mlp().hidden());
    multiple_of_16("model.mlp.vocab_size", model.mlp().vocab_size());
    seq_len = model.mlp().seq_len();
    seq_len_path = "model.mlp.seq_len";
  } else {
    multiple_of_16("model.gpt2.n_embd", model.gpt2().n_embd());
    seq_len = model.gpt2().seq_len();
    seq_len_path = "model.gpt2.seq_len";
  }
  const int64_t tokens = config.data().micro_batch_size() * seq_len;
  require(
      tokens % 16 == 0, "data.micro_batch_size", std::to_string(config.data().micro_batch_size()),
      "times " + seq_len_path + " = " + std::to_string(seq_len) + " (" + std::to_string(tokens) +
          " tokens) " + rule + " (the tokens are the K of the FP8 weight-gradient GEMMs)");
}

void validate_optimizer(const Config::Optimizer& o, int64_t steps) {
  non_negative("optimizer.adamw.lr", o.adamw().lr());
  in_unit_range("optimizer.adamw.beta1", o.adamw().beta1(), true);
  in_unit_range("optimizer.adamw.beta2", o.adamw().beta2(), true);
  positive("optimizer.adamw.eps", o.adamw().eps());
  non_negative("optimizer.adamw.weight_decay", o.adamw().weight_decay());
  non_negative("optimizer.grad_clip", o.grad_clip());
  in_range("optimizer.warmup_steps", o.warmup_steps(), 0, steps);
  in_unit_range("optimizer.min_lr_ratio", o.min_lr_ratio(), false);
}

void validate_precision(const Config::Precision& p) {
  // Every field is checked, also those the chosen mode ignores: a typo should not wait for the
  // day someone switches modes.
  const Config::Precision::LossScale& s = p.loss_scale();
  const double float_max = std::numeric_limits<float>::max();
  positive("precision.loss_scale.min", s.min());
  require(s.max() >= s.min() && s.max() <= float_max, "precision.loss_scale.max",
          format_number(s.max()),
          "must lie in [min = " + format_number(s.min()) + ", " + format_number(float_max) + "]");
  positive("precision.loss_scale.init", s.init());
  if (s.mode() == Config::Precision::LossScale::DYNAMIC) {
    require(s.init() >= s.min() && s.init() <= s.max(), "precision.loss_scale.init",
            format_number(s.init()),
            "must lie in [min, max] = [" + format_number(s.min()) + ", " + format_number(s.max()) +
                "] for a DYNAMIC loss scale");
  } else {
    require(s.init() <= float_max, "precision.loss_scale.init", format_number(s.init()),
            "must be a finite float");
  }
  require(std::isfinite(s.growth_factor()) && s.growth_factor() > 1.0,
          "precision.loss_scale.growth_factor", format_number(s.growth_factor()), "must be > 1");
  require(s.backoff_factor() > 0.0 && s.backoff_factor() < 1.0,
          "precision.loss_scale.backoff_factor", format_number(s.backoff_factor()),
          "must lie in (0, 1)");
  at_least("precision.loss_scale.growth_interval", s.growth_interval(), 1);
  at_least("precision.loss_scale.hysteresis", s.hysteresis(), 1);
  at_least("precision.loss_scale.max_overflows_at_min", s.max_overflows_at_min(), 1);

  in_range("precision.fp8.amax_history_len", p.fp8().amax_history_len(), 1, 1 << 20);
  // 2^-margin scales a float: beyond ~100 the scale underflows.
  in_range("precision.fp8.margin", p.fp8().margin(), 0, 100);
}

void validate_dist(const Config::Dist& d) {
  require(std::isfinite(d.bucket_mb()) && d.bucket_mb() > 0.0 && d.bucket_mb() <= 65536.0,
          "dist.bucket_mb", format_number(d.bucket_mb()), "must lie in (0, 65536]");
  in_range("dist.zero_stage", d.zero_stage(), 0, 1);
  positive("dist.timeout_s", d.timeout_s());
  at_least("dist.consistency_check_every", d.consistency_check_every(), 0);
}

void validate_metrics(const Config::Metrics& m) {
  require(!m.bind_address().empty(), "metrics.bind_address", quoted(m.bind_address()),
          "must be an address to listen on, e.g. 127.0.0.1 or 0.0.0.0");
  in_range("metrics.port", m.port(), 0, 65535);
  const std::string& url = m.pushgateway_url();
  require(url.empty() || url.starts_with("http://"), "metrics.pushgateway_url", quoted(url),
          "must be empty or start with http://");
  at_least("metrics.push_every", m.push_every(), 1);
  non_negative("metrics.peak_tflops", m.peak_tflops());
}

void validate_debug(const Config::Debug& d, int64_t steps) {
  at_least("debug.inject_nonfinite_rank", d.inject_nonfinite_rank(), 0);
  for (int i = 0; i < d.inject_nonfinite_steps_size(); ++i) {
    in_range("debug.inject_nonfinite_steps[" + std::to_string(i) + "]", d.inject_nonfinite_steps(i),
             0, steps - 1);
  }
}

}  // namespace

// -------------------------------------------------------------------------------------------------

TrainConfig parse_config_text(std::string_view text, const std::string& source) {
  TrainConfig config;
  parse_text(text, source, config);
  return config;
}

TrainConfig load_config_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw core::ConfigError(path + ": cannot open config: " + std::strerror(errno));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw core::ConfigError(path + ": cannot read config: " + std::strerror(errno));
  return parse_config_text(text.str(), path);
}

void apply_override(TrainConfig& config, std::string_view assignment) {
  const std::string prefix = "--set " + std::string(assignment) + ": ";
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    throw core::ConfigError(prefix + "expected path.to.field=value");
  }
  try {
    const FieldRef ref = resolve(config, assignment.substr(0, eq), false);
    set_from_text(*ref.message, *ref.field, assignment.substr(eq + 1));
  } catch (const core::ConfigError& e) {
    throw core::ConfigError(prefix + e.what());
  }
}

void apply_defaults(TrainConfig& config, const std::string& config_path) {
  if (config.model().arch_case() == Config::Model::ARCH_NOT_SET)
    config.mutable_model()->mutable_gpt2();
  if (config.data().source_case() == Config::Data::SOURCE_NOT_SET) {
    config.mutable_data()->mutable_synthetic();
  }
  for (const auto& [path, value] : kDefaults) {
    const FieldRef ref = resolve(config, path, true);
    if (ref.field == nullptr || ref.message->GetReflection()->HasField(*ref.message, ref.field)) {
      continue;
    }
    set_from_text(*ref.message, *ref.field, value);
  }
  Config::Precision::LossScale& scale = *config.mutable_precision()->mutable_loss_scale();
  if (!scale.has_mode()) {
    scale.set_mode(config.precision().mode() == Config::Precision::FP16
                       ? Config::Precision::LossScale::DYNAMIC
                       : Config::Precision::LossScale::NONE);
  }
  if (!config.run().has_dir()) {
    const std::string stem = std::filesystem::path(config_path).stem().string();
    config.mutable_run()->set_dir("runs/" + (stem.empty() ? std::string("default") : stem));
  }
}

// The environment switches of the CPU backend, checked before anything runs (not at the first
// GEMM or cast that reads them).
void validate_environment() {
  try {
    core::check_cpu_switches();
  } catch (const core::Error& e) {
    throw core::ConfigError(std::string("environment: ") + e.what());
  }
}

void validate(const TrainConfig& config) {
  const Config::Run& run = config.run();
  at_least("run.steps", run.steps(), 1);
  at_least("run.log_every", run.log_every(), 1);
  require(!run.dir().empty(), "run.dir", quoted(run.dir()), "must name a directory");

  const ModelShape model = validate_model(config.model());
  validate_data(config.data(), model);
  validate_optimizer(config.optimizer(), run.steps());
  validate_precision(config.precision());
  validate_fp8_shapes(config);
  validate_dist(config.dist());

  at_least("checkpoint.every_steps", config.checkpoint().every_steps(), 0);
  at_least("checkpoint.keep", config.checkpoint().keep(), 0);
  validate_metrics(config.metrics());
  validate_debug(config.debug(), run.steps());
  validate_environment();
}

std::string describe_defaults() {
  std::string out;
  for (const auto& [path, value] : kDefaults) {
    out += "  " + std::string(path) + " = " + (value.empty() ? "\"\"" : std::string(value)) + "\n";
  }
  out += "  precision.loss_scale.mode = DYNAMIC for FP16, NONE otherwise\n";
  out += "  run.dir = runs/<config file name without extension>\n";
  out += "  model = gpt2 {}, data source = synthetic {} when none is given\n";
  return out;
}

std::string to_text(const TrainConfig& config) {
  std::string text;
  pb::TextFormat::PrintToString(config, &text);
  return text;
}

void require(bool ok, std::string_view path, std::string_view value, std::string_view rule) {
  if (!ok) {
    throw core::ConfigError(std::string(path) + " = " + std::string(value) + ": " +
                            std::string(rule));
  }
}

std::string format_number(double value) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, end);
}

// -------------------------------------------------------------------------------------------------
// Translations.

core::PrecisionPolicy precision_policy(const TrainConfig& config) {
  switch (config.precision().mode()) {
    case Config::Precision::BF16:
      return core::PrecisionPolicy::from_mode(core::PrecisionMode::kBF16);
    case Config::Precision::FP16:
      return core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP16);
    case Config::Precision::FP8_HYBRID:
      return core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP8Hybrid);
    default: return core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32);
  }
}

core::LossScalerConfig loss_scaler_config(const TrainConfig& config) {
  const Config::Precision::LossScale& s = config.precision().loss_scale();
  core::LossScalerConfig c;
  switch (s.mode()) {
    case Config::Precision::LossScale::STATIC: c.mode = core::LossScaleMode::kStatic; break;
    case Config::Precision::LossScale::NONE: c.mode = core::LossScaleMode::kNone; break;
    default: c.mode = core::LossScaleMode::kDynamic; break;
  }
  c.init = s.init();
  c.growth_factor = s.growth_factor();
  c.backoff_factor = s.backoff_factor();
  c.growth_interval = s.growth_interval();
  c.hysteresis = s.hysteresis();
  c.min = s.min();
  c.max = s.max();
  c.max_overflows_at_min = s.max_overflows_at_min();
  return c;
}

core::Fp8ScalingConfig fp8_scaling_config(const TrainConfig& config) {
  const Config::Precision::Fp8& f = config.precision().fp8();
  core::Fp8ScalingConfig c;
  c.recipe = f.recipe() == Config::Precision::Fp8::CURRENT ? core::Fp8Recipe::kCurrent
                                                           : core::Fp8Recipe::kDelayed;
  c.amax_history_len = f.amax_history_len();
  c.amax_compute = f.amax_compute() == Config::Precision::Fp8::MOST_RECENT
                       ? core::AmaxCompute::kMostRecent
                       : core::AmaxCompute::kMax;
  c.margin = f.margin();
  return c;
}

core::AdamWConfig adamw_config(const TrainConfig& config) {
  const Config::Optimizer::AdamW& a = config.optimizer().adamw();
  core::AdamWConfig c;
  c.beta1 = static_cast<float>(a.beta1());
  c.beta2 = static_cast<float>(a.beta2());
  c.eps = static_cast<float>(a.eps());
  c.weight_decay = static_cast<float>(a.weight_decay());
  return c;
}

core::LrScheduleConfig lr_schedule_config(const TrainConfig& config) {
  core::LrScheduleConfig c;
  c.lr = config.optimizer().adamw().lr();
  c.warmup_steps = config.optimizer().warmup_steps();
  c.total_steps = config.run().steps();
  c.min_lr_ratio = config.optimizer().min_lr_ratio();
  return c;
}

dist::DistConfig dist_config(const TrainConfig& config) {
  const Config::Dist& d = config.dist();
  dist::DistConfig c;
  switch (d.backend()) {
    case Config::Dist::MPI: c.backend = dist::CommBackend::kMPI; break;
    case Config::Dist::NCCL: c.backend = dist::CommBackend::kNCCL; break;
    default: c.backend = dist::CommBackend::kAuto; break;
  }
  switch (d.grad_reduce_dtype()) {
    case Config::Dist::FP32: c.grad_reduce_dtype = core::DType::kF32; break;
    case Config::Dist::FP16: c.grad_reduce_dtype = core::DType::kF16; break;
    case Config::Dist::FP8_E4M3: c.grad_reduce_dtype = core::DType::kE4M3; break;
    case Config::Dist::FP8_E5M2: c.grad_reduce_dtype = core::DType::kE5M2; break;
    default: c.grad_reduce_dtype = core::DType::kBF16; break;
  }
  c.accumulate_fp32 = d.accumulate_fp32();
  c.bucket_mb = d.bucket_mb();
  c.overlap = d.overlap();
  c.zero_stage = d.zero_stage();
  c.timeout_s = d.timeout_s();
  c.consistency_check_every = d.consistency_check_every();
  return c;
}

}  // namespace mantissa::launcher
