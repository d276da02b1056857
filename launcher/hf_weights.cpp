#include "launcher/hf_weights.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <google/protobuf/util/message_differencer.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <vector>

#include "checkpoint/safetensors.h"
#include "core/dtype/dtype.h"
#include "core/durable_file.h"
#include "core/error.h"
#include "core/json_nesting.h"
#include "core/json_string.h"
#include "core/missing_directories.h"
#include "core/read_file.h"
#include "models/gpt2/hf_layout.h"
#include "models/llama/hf_layout.h"

namespace mantissa::launcher {
namespace {

namespace fs = std::filesystem;
using google::protobuf::Value;

// ---- JSON ------------------------------------------------------------------------------------

Value parse_json_value(const std::string& text) {
  google::protobuf::Struct wrapper;
  const auto status = google::protobuf::util::JsonStringToMessage("{\"v\":" + text + "}", &wrapper);
  MANTISSA_CHECK(status.ok(), "bad JSON value in a layout table: " << text);
  return wrapper.fields().at("v");
}

std::string json_text(const Value& v) {
  std::string text;
  (void)google::protobuf::util::MessageToJsonString(v, &text);
  return text;
}

// JSON numbers are doubles; a float field written from a float (1e-05) and read back as a
// double, or written by another tool with more digits, is the same value within 1e-6.
bool same_json(const Value& a, const Value& b) {
  if (a.kind_case() == Value::kNumberValue && b.kind_case() == Value::kNumberValue) {
    const double x = a.number_value(), y = b.number_value();
    return x == y || std::fabs(x - y) <= 1e-6 * std::max(std::fabs(x), std::fabs(y));
  }
  return google::protobuf::util::MessageDifferencer::Equals(a, b);
}

// ---- reading a directory ---------------------------------------------------------------------

// The JSON object in the file `path` (config.json, the shards' index).
google::protobuf::Struct read_json_object(const std::string& path) {
  const std::string text = core::read_whole_file(path, "JSON file");
  const std::optional<size_t> too_deep = core::json_too_deep_at(text);
  MANTISSA_REQUIRE(!too_deep, kConfig,
                   "'" << path << "' nests deeper than " << core::kMaxJsonNesting
                       << " levels at its byte " << too_deep.value_or(0));
  google::protobuf::Struct object;
  const auto status = google::protobuf::util::JsonStringToMessage(text, &object);
  MANTISSA_REQUIRE(status.ok() && text.find('{') != std::string::npos, kConfig,
                   "'" << path << "' is not a JSON object: " << status.ToString());
  return object;
}

// Transformers 5 writes RoPE's settings as one object, "rope_parameters": {"rope_type",
// "rope_theta", ...}, in place of "rope_theta" and "rope_scaling": its theta is read as
// rope_theta, and a rope_type other than "default" is a scaling, which is refused.
void read_rope_parameters(google::protobuf::Struct& config, const std::string& path) {
  const auto found = config.fields().find("rope_parameters");
  if (found == config.fields().end() || found->second.kind_case() != Value::kStructValue) return;
  const auto& parameters = found->second.struct_value().fields();
  if (const auto type = parameters.find("rope_type"); type != parameters.end()) {
    MANTISSA_REQUIRE(
        type->second.kind_case() == Value::kStringValue && type->second.string_value() == "default",
        kConfig,
        "'" << path << "': rope_parameters.rope_type = " << json_text(type->second)
            << ": a RoPE scaling, which mantissa's Llama does not have (\"default\" "
               "only)");
  }
  const auto theta = parameters.find("rope_theta");
  if (theta != parameters.end() && !config.fields().contains("rope_theta")) {
    (*config.mutable_fields())["rope_theta"] = theta->second;
  }
}

void check_config_json(const std::string& dir, const models::HfLayout& layout) {
  const std::string path = (fs::path(dir) / kHfConfigFile).string();
  google::protobuf::Struct config = read_json_object(path);
  read_rope_parameters(config, path);
  for (const models::HfConfigField& f : layout.config) {
    if (f.rule == models::HfConfigField::Rule::kWritten) continue;
    const auto found = config.fields().find(f.key);
    MANTISSA_REQUIRE(
        found != config.fields().end() || !f.fallback.empty(), kConfig,
        "'" << path << "': no \"" << f.key << "\" field (" << layout.family << " needs it)");
    // Absent, or null where transformers derives the value: the default.
    const bool absent = found == config.fields().end();
    const bool null =
        !absent && found->second.kind_case() == Value::kNullValue && f.null_is_fallback;
    const Value file = absent || null ? parse_json_value(f.fallback) : found->second;
    const Value ours = parse_json_value(f.value);
    const std::string given = f.key + " = " + json_text(file) +
                              (absent ? " (absent: transformers' default)"
                               : null ? " (null: transformers' default)"
                                      : "");
    const std::string wanted = f.source.empty() ? "mantissa's " + layout.family + " has " + f.value
                                                : f.source + " = " + f.value;
    if (f.rule == models::HfConfigField::Rule::kAtLeast) {
      MANTISSA_REQUIRE(
          file.kind_case() == Value::kNumberValue && file.number_value() >= ours.number_value(),
          kConfig, "'" << path << "': " << given << " is below " << wanted);
    } else {
      MANTISSA_REQUIRE(
          same_json(file, ours) || (!f.also.empty() && same_json(file, parse_json_value(f.also))),
          kConfig, "'" << path << "': " << given << " disagrees with " << wanted);
    }
  }
}

// A tensor's values as FP32, from the dtypes weights are published in.
void to_f32(const std::vector<char>& raw, const std::string& dtype, float* out) {
  const size_t n = raw.size() / checkpoint::safetensors_dtype_bytes(dtype);
  if (dtype == "F32") {
    std::memcpy(out, raw.data(), n * 4);
    return;
  }
  for (size_t i = 0; i < n; ++i) {
    uint16_t bits;
    std::memcpy(&bits, raw.data() + 2 * i, 2);
    out[i] = dtype == "BF16" ? core::bf16_to_float(core::bf16{bits})
                             : core::fp16_to_float(core::fp16{bits});
  }
}

// The safetensors files of a model directory, and the file that lists them (what an error
// about a tensor missing from all of them names).
struct WeightFiles {
  std::vector<std::string> paths;
  std::string source;
};

// model.safetensors, or else the shards that model.safetensors.index.json's weight_map names
// (transformers splits a checkpoint past its max_shard_size), each once, in name order. A
// shard must be a file of `dir` itself.
WeightFiles weight_files(const std::string& dir) {
  const fs::path single = fs::path(dir) / kHfWeightsFile;
  const fs::path index = fs::path(dir) / kHfWeightsIndexFile;
  std::error_code ec;
  if (fs::exists(single, ec) || !fs::exists(index, ec)) {
    return {{single.string()}, single.string()};
  }
  const google::protobuf::Struct json = read_json_object(index.string());
  const auto map = json.fields().find("weight_map");
  MANTISSA_REQUIRE(map != json.fields().end() && map->second.has_struct_value(), kConfig,
                   "'" << index.string() << "': not a JSON object with a \"weight_map\" object");
  std::set<std::string> shards;
  for (const auto& [tensor, file] : map->second.struct_value().fields()) {
    const std::string name = file.string_value();
    MANTISSA_REQUIRE(file.has_string_value() && !name.empty() &&
                         fs::path(name).filename().string() == name && name != "." && name != "..",
                     kConfig,
                     "'" << index.string() << "': tensor '" << tensor << "' maps to "
                         << json_text(file) << ", not the name of a file in " << dir);
    shards.insert(name);
  }
  MANTISSA_REQUIRE(!shards.empty(), kConfig,
                   "'" << index.string() << "': its weight_map names no tensor");
  WeightFiles files{{}, index.string()};
  for (const std::string& name : shards) files.paths.push_back((fs::path(dir) / name).string());
  return files;
}

// One safetensors file of a model directory, its header read.
struct WeightFile {
  std::string path;
  checkpoint::SafetensorsHeader header;
};

// A tensor of one of the files, matched to the layout's tensor it fills.
struct MatchedTensor {
  const WeightFile* file;
  const checkpoint::SafetensorsEntry* entry;
  const models::HfTensor* tensor;
};

// The layout's row for each tensor of `files`, in file order, after every name, dtype and
// shape was checked against the layout: each tensor known (or a buffer the layout ignores),
// found once over all the files, with the layout's shape and a float dtype; and every layout
// tensor found (`source` names the files in that error). Throws on the first problem.
std::vector<MatchedTensor> match_tensors(const std::vector<WeightFile>& files,
                                         const std::string& source,
                                         const models::HfLayout& layout) {
  std::map<std::string, const models::HfTensor*> wanted;
  for (const models::HfTensor& t : layout.tensors) wanted[t.name] = &t;
  const std::set<std::string> ignored(layout.ignored.begin(), layout.ignored.end());
  std::set<std::string> seen;
  std::vector<MatchedTensor> matched;
  for (const WeightFile& file : files) {
    const std::string& path = file.path;
    for (const checkpoint::SafetensorsEntry& e : file.header.tensors) {
      if (!layout.tied_copy.empty() && e.name == layout.tied_copy) continue;  // check_tied_copies
      std::string name = e.name;
      if (!layout.optional_prefix.empty() && !name.starts_with(layout.optional_prefix))
        name = layout.optional_prefix + name;
      if (ignored.contains(name)) continue;
      const auto found = wanted.find(name);
      MANTISSA_REQUIRE(found != wanted.end(), kConfig,
                       "'" << path << "': tensor '" << e.name << "' is not a parameter of this "
                           << layout.family << " (" << layout.architecture << ")");
      MANTISSA_REQUIRE(seen.insert(name).second, kConfig,
                       "'" << path << "': tensor '" << name
                           << "' is there twice (with and without '" << layout.optional_prefix
                           << "', or in two shards)");
      const models::HfTensor& t = *found->second;
      MANTISSA_REQUIRE(e.dtype == "F32" || e.dtype == "BF16" || e.dtype == "F16", kConfig,
                       "'" << path << "': tensor '" << e.name << "' has dtype " << e.dtype
                           << "; F32, BF16 and F16 weights are read");
      MANTISSA_REQUIRE(e.shape == t.shape(), kConfig,
                       "'" << path << "': tensor '" << e.name << "' is "
                           << core::Shape(e.shape).str() << ", the model needs "
                           << core::Shape(t.shape()).str());
      matched.push_back({&file, &e, &t});
    }
  }
  for (const models::HfTensor& t : layout.tensors)
    MANTISSA_REQUIRE(seen.contains(t.name), kConfig,
                     "'" << source << "': tensor '" << t.name << "' is missing (" << layout.family
                         << " needs it for " << t.parameter << ")");
  return matched;
}

// A tied model's lm_head.weight that a file carries must be the embedding it ties to (`to`,
// whose bytes the import has just read: `raw`), byte for byte: two different matrices cannot
// become one parameter.
void check_tied_copies(const std::vector<WeightFile>& files, const models::HfLayout& layout,
                       const checkpoint::SafetensorsEntry& to, const std::vector<char>& raw) {
  for (const WeightFile& file : files) {
    for (const checkpoint::SafetensorsEntry& e : file.header.tensors) {
      if (e.name != layout.tied_copy) continue;
      const bool same = e.dtype == to.dtype && e.shape == to.shape &&
                        checkpoint::safetensors_data_equals(file.path, file.header, e, raw);
      MANTISSA_REQUIRE(same, kConfig,
                       "'" << file.path << "': tensor '" << e.name << "' differs from '" << to.name
                           << "', which this " << layout.family
                           << " ties it to (tie_word_embeddings): one matrix serves both");
    }
  }
}

// Guards the copies against a table row that does not lie inside its parameter.
void check_fits(const models::HfTensor& t, const train::Parameter& p) {
  const core::Shape& s = p.spec.shape;
  const bool fits = (t.cols == 0 ? s.rank() == 1 : s.rank() == 2 && s[1] == t.cols) &&
                    t.row_begin >= 0 && t.rows >= 0 && t.row_begin + t.rows <= s[0];
  MANTISSA_CHECK(fits, "Hugging Face layout: "
                           << t.name << " (rows " << t.row_begin << " + " << t.rows << " of width "
                           << t.cols << ") does not fit " << p.spec.name << " " << s.str());
}

// The parameter of each table row; throws naming a parameter the model does not have.
std::vector<const train::Parameter*> parameters_of(const models::HfLayout& layout,
                                                   const train::ParameterStore& params) {
  std::map<std::string, const train::Parameter*> by_name;
  for (const train::Parameter& p : params.all()) by_name[p.spec.name] = &p;
  std::vector<const train::Parameter*> out;
  for (const models::HfTensor& t : layout.tensors) {
    const auto found = by_name.find(t.parameter);
    MANTISSA_CHECK(found != by_name.end(), "Hugging Face layout: the model has no parameter "
                                               << t.parameter << " (for " << t.name << ")");
    check_fits(t, *found->second);
    out.push_back(found->second);
  }
  return out;
}

// ---- writing a directory ---------------------------------------------------------------------

// Refuses a `dir` that holds anything; makes a fresh, empty `tmp`. Returns the directories it
// made above `tmp` (a nested --out's parents), deepest first, for a failure to remove.
std::vector<fs::path> prepare_directories(const fs::path& dir, const fs::path& tmp) {
  std::error_code ec;
  if (fs::exists(dir, ec)) {
    if (!fs::is_directory(dir, ec))
      throw core::ConfigError("--out " + dir.string() + ": exists and is not a directory");
    if (!fs::is_empty(dir, ec))
      throw core::ConfigError("--out " + dir.string() +
                              ": exists and is not empty (remove it, or choose another directory)");
  }
  if (fs::exists(tmp, ec)) {
    // Only what an export of ours leaves: our three files and their temporary files
    // (core::DurableFile::temporary_beside: "<name>.<pid>-<n>.tmp").
    const auto ours = [](const std::string& name) {
      for (const std::string file : {kHfWeightsFile, kHfConfigFile, kHfTokenizerFile}) {
        if (name == file) return true;
        if (name.starts_with(file + ".") && name.ends_with(".tmp")) return true;
      }
      return false;
    };
    bool stale = fs::is_directory(tmp, ec);
    for (const auto& entry : fs::directory_iterator(tmp, ec))
      stale = stale && ours(entry.path().filename().string());
    if (!stale)
      throw core::ConfigError("--out " + dir.string() + ": " + tmp.string() +
                              " exists and is not a directory left by an export (remove it)");
    fs::remove_all(tmp, ec);
    MANTISSA_REQUIRE(!ec, kFailure,
                     "cannot remove the stale " << tmp.string() << ": " << ec.message());
  }
  const std::vector<fs::path> parents = core::missing_directories(tmp.parent_path());
  fs::create_directories(tmp, ec);
  if (ec) {
    std::error_code ignored;
    for (const fs::path& p : parents) fs::remove(p, ignored);
    core::throw_error_of_kind(core::path_error_kind(ec.value()),
                              "cannot create " + tmp.string() + ": " + ec.message());
  }
  return parents;
}

}  // namespace

models::HfLayout hf_layout_of(train::LanguageModel& model, const std::string& field) {
  if (const auto* gpt2 = dynamic_cast<models::GPT2*>(&model))
    return models::gpt2_hf_layout(gpt2->config());
  if (const auto* llama = dynamic_cast<models::Llama*>(&model))
    return models::llama_hf_layout(llama->config());
  throw core::ConfigError(field +
                          ": Hugging Face model directories hold GPT-2 and Llama "
                          "models (model.gpt2, model.llama), not this one");
}

std::string hf_config_json(const models::HfLayout& layout) {
  std::string text = "{\n";
  for (size_t i = 0; i < layout.config.size(); ++i) {
    const models::HfConfigField& f = layout.config[i];
    text += "  ";
    text += core::json_quoted(f.key);
    text += ": ";
    text += f.value;
    text += i + 1 < layout.config.size() ? ",\n" : "\n";
  }
  return text + "}\n";
}

// The files of an export, written into the temporary directory `tmp`.
void write_hf_files(const fs::path& tmp, const models::HfLayout& layout,
                    const train::ParameterStore& params, core::Backend& backend,
                    const std::optional<std::string>& tokenizer,
                    const std::map<std::string, std::string>& metadata) {
  const std::vector<const train::Parameter*> sources = parameters_of(layout, params);
  // Each tensor is cut from its parameter's FP32 values on the host; consecutive tensors of one
  // parameter (q, k, v of one qkv_proj) share one copy.
  std::vector<float> host;
  const train::Parameter* in_host = nullptr;
  std::vector<checkpoint::SafetensorsOutput> outputs;
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const models::HfTensor& t = layout.tensors[i];
    const train::Parameter* p = sources[i];
    outputs.push_back({t.name, t.shape(), [&, p](float* out) {
                         if (in_host != p) {
                           host.resize(static_cast<size_t>(p->numel()));
                           core::Tensor view =
                               core::Tensor::wrap(host.data(), p->spec.shape, core::DType::kF32);
                           backend.copy(p->master, view);
                           backend.synchronize();
                           in_host = p;
                         }
                         models::to_hf(t, host.data(), out);
                       }});
  }
  std::map<std::string, std::string> file_metadata = metadata;
  file_metadata["format"] = "pt";  // transformers refuses safetensors files without it
  checkpoint::write_safetensors((tmp / kHfWeightsFile).string(), outputs, file_metadata);
  core::write_file_atomically((tmp / kHfConfigFile).string(), hf_config_json(layout));
  if (tokenizer) {
    std::error_code ec;
    fs::copy_file(*tokenizer, tmp / kHfTokenizerFile, ec);
    MANTISSA_REQUIRE(!ec, kFailure,
                     "cannot copy the tokenizer " << *tokenizer << " to " << tmp.string() << ": "
                                                  << ec.message());
    core::fsync_path((tmp / kHfTokenizerFile).string());
  }
}

void export_hf_directory(const std::string& dir, const models::HfLayout& layout,
                         const train::ParameterStore& params, core::Backend& backend,
                         const std::optional<std::string>& tokenizer,
                         const std::map<std::string, std::string>& metadata) {
  params.require_all_masters("Hugging Face export to " + dir);
  // "out/" and "out" are the same directory; its temporary sibling is "out.tmp".
  const fs::path target = fs::path(dir).lexically_normal();
  const fs::path final_dir = target.has_filename() ? target : target.parent_path();
  const fs::path tmp = final_dir.string() + ".tmp";
  const std::vector<fs::path> made_parents = prepare_directories(final_dir, tmp);

  try {
    write_hf_files(tmp, layout, params, backend, tokenizer, metadata);
    core::fsync_path(tmp.string());
    // rename(2) replaces an empty directory; a non-empty one was refused above.
    std::error_code ec;
    fs::rename(tmp, final_dir, ec);
    MANTISSA_REQUIRE(
        !ec, kFailure,
        "cannot rename " << tmp.string() << " to " << final_dir.string() << ": " << ec.message());
  } catch (...) {
    std::error_code ignored;
    fs::remove_all(tmp, ignored);                                   // what a failure part way wrote
    for (const fs::path& p : made_parents) fs::remove(p, ignored);  // only while empty
    throw;
  }
  core::fsync_parent_directory(final_dir.string());
}

bool is_hf_directory(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec);
}

void import_hf_directory(const std::string& dir, const models::HfLayout& layout,
                         train::ParameterStore& params, core::Backend& backend) {
  check_config_json(dir, layout);
  const WeightFiles listed = weight_files(dir);
  std::vector<WeightFile> files;
  for (const std::string& path : listed.paths)
    files.push_back({path, checkpoint::read_safetensors_header(path)});
  const std::vector<MatchedTensor> matched = match_tensors(files, listed.source, layout);

  const std::vector<const train::Parameter*> sources = parameters_of(layout, params);
  std::map<const models::HfTensor*, const train::Parameter*> parameter;
  for (size_t i = 0; i < layout.tensors.size(); ++i) parameter[&layout.tensors[i]] = sources[i];
  // Every file goes into a host copy of the masters first (zero where no tensor writes: the
  // vocabulary padding and the store's alignment gaps), so a failure half-way leaves the model
  // as it was.
  std::vector<float> masters(static_cast<size_t>(params.flat_numel()), 0.0f);
  std::vector<float> values;
  for (const MatchedTensor& m : matched) {
    const std::vector<char> raw =
        checkpoint::read_safetensors_data(m.file->path, m.file->header, *m.entry);
    if (!layout.tied_to.empty() && m.tensor->name == layout.tied_to)
      check_tied_copies(files, layout, *m.entry, raw);
    values.resize(static_cast<size_t>(m.tensor->numel()));
    to_f32(raw, m.entry->dtype, values.data());
    // Training from a NaN or inf would end at its first step blaming the learning rate.
    const auto bad =
        std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
    MANTISSA_REQUIRE(bad == values.end(), kConfig,
                     "'" << m.file->path << "': tensor '" << m.entry->name << "' element "
                         << bad - values.begin() << " is " << *bad);
    models::from_hf(*m.tensor, values.data(), masters.data() + parameter.at(m.tensor)->offset);
  }
  params.set_weights(backend, core::Tensor::wrap(masters.data(), core::Shape{params.flat_numel()},
                                                 core::DType::kF32));
}

}  // namespace mantissa::launcher
