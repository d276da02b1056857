// Hugging Face model directories (launcher/hf_weights.h): an export read back into a fresh
// model gives identical masters (GPT-2; Llama tied and untied, with grouped-query attention),
// also from BF16 tensors and from the Hub's unprefixed GPT-2 names with their mask buffers;
// and every way a directory can be wrong — a missing, extra, misshapen or wrongly typed
// tensor, a config.json field that disagrees (or is absent with a default that disagrees), a
// truncated or malformed file — is refused with one message naming the file and the tensor or
// field, leaving the model untouched. The export refuses a non-empty directory and leaves no
// half-written one; it copies the run's tokenizer.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "checkpoint/safetensors.h"
#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/precision/policy.h"
#include "launcher/export.h"
#include "launcher/hf_weights.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"
#include "models/mlp/mlp.h"
#include "tests/models/tiny_hf_llama.h"

using namespace mantissa;
namespace fs = std::filesystem;

namespace {

const core::PrecisionPolicy kFP32 = core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32);

const models::GPT2Config kGpt2{
    .n_layer = 2, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab_size = 10};

class HfWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("mantissa_hf_" + std::to_string(::getpid()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::string path(const std::string& name) const { return (root_ / name).string(); }

  // Exports `model` to a new directory `name`.
  std::string export_model(train::LanguageModel& model, const std::string& name,
                           const std::optional<std::string>& tokenizer = std::nullopt) {
    const std::string dir = path(name);
    launcher::export_hf_directory(dir, launcher::hf_layout_of(model, "test"), model.parameters(),
                                  *backend_, tokenizer);
    return dir;
  }

  // The message of the error importing `dir` into `model`, "" when it succeeds.
  std::string import_error(const std::string& dir, train::LanguageModel& model) {
    try {
      launcher::import_hf_directory(dir, launcher::hf_layout_of(model, "test"), model.parameters(),
                                    *backend_);
    } catch (const core::ConfigError& e) {  // a directory that does not fit: the input to fix
      EXPECT_EQ(std::string(e.what()).find(".cpp:"), std::string::npos) << e.what();
      return e.what();
    }
    return "";
  }

  fs::path root_;
  std::unique_ptr<core::Backend> backend_ = core::make_cpu_backend();
};

std::vector<float> masters(train::LanguageModel& model) {
  const core::Tensor& m = model.parameters().masters();
  const float* p = m.data_as<float>();
  return {p, p + m.numel()};
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// config.json with the line of `key` replaced by `line` (removed when empty); our export
// writes one field per line.
void edit_config(const std::string& dir, const std::string& key, const std::string& line) {
  const std::string path = dir + "/config.json";
  std::string text = read_text(path);
  const size_t begin = text.find("  \"" + key + "\":");
  ASSERT_NE(begin, std::string::npos) << key;
  const size_t end = text.find('\n', begin) + 1;
  const bool last = text.compare(end, 1, "}") == 0;
  std::string replacement;
  if (!line.empty()) {
    replacement += "  ";
    replacement += line;
    replacement += last ? "\n" : ",\n";
  }
  text.replace(begin, end - begin, replacement);
  if (line.empty() && last) {  // the new last field loses its comma
    const size_t comma = text.rfind(',', begin);
    text.erase(comma, 1);
  }
  write_text(path, text);
}

// A safetensors file written byte by byte: each tensor's name, dtype, shape and raw data.
struct RawTensor {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

void write_raw(const std::string& path, const std::vector<RawTensor>& tensors) {
  // Appends only: GCC 12 misreports `const char* + std::string` (-Wrestrict).
  std::ostringstream header;
  header << "{";
  size_t offset = 0;
  for (size_t k = 0; k < tensors.size(); ++k) {
    const RawTensor& t = tensors[k];
    header << (k ? "," : "") << "\"" << t.name << "\":{\"dtype\":\"" << t.dtype << "\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) header << (i ? "," : "") << t.shape[i];
    header << "],\"data_offsets\":[" << offset << "," << offset + t.data.size() << "]}";
    offset += t.data.size();
  }
  header << "}";
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const std::string text = header.str();
  const uint64_t n = text.size();
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << text;
  for (const RawTensor& t : tensors)
    out.write(t.data.data(), static_cast<std::streamsize>(t.data.size()));
}

std::vector<RawTensor> read_raw(const std::string& path) {
  std::vector<RawTensor> out;
  for (auto& t : checkpoint::read_safetensors(path).tensors)
    out.push_back({t.name, t.dtype, t.shape, std::move(t.data)});
  return out;
}

}  // namespace

TEST_F(HfWeights, Gpt2RoundTripIsExact) {
  models::GPT2 a(kGpt2, *backend_, kFP32, 1);
  models::GPT2 b(kGpt2, *backend_, kFP32, 2);
  ASSERT_NE(masters(a), masters(b));
  const std::string dir = export_model(a, "gpt2");
  EXPECT_EQ(import_error(dir, b), "");
  EXPECT_EQ(masters(a), masters(b)) << "every element, the padding's zeros included";
  EXPECT_FALSE(fs::exists(dir + ".tmp"));
  EXPECT_FALSE(fs::exists(dir + "/tokenizer.model"));
  const checkpoint::SafetensorsFile file = checkpoint::read_safetensors(dir + "/model.safetensors");
  EXPECT_EQ(file.metadata.at("format"), "pt");
  // Conv1D's [in, out]: c_attn.weight is our [3C, C] transposed.
  bool found = false;
  for (const auto& t : file.tensors) {
    if (t.name != "transformer.h.1.attn.c_attn.weight") continue;
    found = true;
    ASSERT_EQ(t.shape, (std::vector<int64_t>{8, 24}));
    const float* ours = nullptr;
    for (const train::Parameter& p : a.parameters().all())
      if (p.spec.name == "h.1.attn.c_attn.weight") ours = p.master.data_as<float>();
    ASSERT_NE(ours, nullptr);
    const auto* theirs = reinterpret_cast<const float*>(t.data.data());
    for (int in = 0; in < 8; ++in)
      for (int out = 0; out < 24; ++out) ASSERT_EQ(theirs[in * 24 + out], ours[out * 8 + in]);
  }
  EXPECT_TRUE(found) << "no transformer.h.1.attn.c_attn.weight in the export";

  // Into a BF16 model: the same masters, the compute copy their rounding.
  models::GPT2 c(kGpt2, *backend_, core::PrecisionPolicy::from_mode(core::PrecisionMode::kBF16), 3);
  EXPECT_EQ(import_error(dir, c), "");
  EXPECT_EQ(masters(a), masters(c));
  const std::vector<float> imported = masters(c);
  const auto* compute = c.parameters().compute().data_as<core::bf16>();
  ASSERT_EQ(c.parameters().compute().numel(), static_cast<int64_t>(imported.size()));
  for (size_t i = 0; i < imported.size(); ++i) {
    ASSERT_EQ(compute[i].bits, core::round_to<core::bf16>(imported[i]).bits) << "element " << i;
  }
}

TEST_F(HfWeights, LlamaRoundTripIsExact) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    models::Llama a(models::testing::tiny_hf_llama(tied), *backend_, kFP32, 1);
    models::Llama b(models::testing::tiny_hf_llama(tied), *backend_, kFP32, 2);
    ASSERT_NE(masters(a), masters(b));
    const std::string dir = export_model(a, tied ? "tied" : "untied");
    EXPECT_EQ(import_error(dir, b), "");
    EXPECT_EQ(masters(a), masters(b));
    bool has_lm_head = false;
    for (const auto& t : checkpoint::read_safetensors(dir + "/model.safetensors").tensors)
      has_lm_head = has_lm_head || t.name == "lm_head.weight";
    EXPECT_EQ(has_lm_head, !tied);
    // A directory of the other kind does not fit.
    models::Llama other(models::testing::tiny_hf_llama(!tied), *backend_, kFP32, 2);
    EXPECT_NE(import_error(dir, other)
                  .find(std::string("tie_word_embeddings = ") + (tied ? "true" : "false") +
                        " disagrees with model.llama.tie_embeddings"),
              std::string::npos)
        << import_error(dir, other);
  }
}

TEST_F(HfWeights, ReadsBf16AndTheHubsGpt2Names) {
  models::GPT2 a(kGpt2, *backend_, kFP32, 1);
  const std::string dir = export_model(a, "gpt2");
  const std::string weights = dir + "/model.safetensors";
  // The Hub's gpt2 file: no "transformer." prefix, the causal-mask buffers beside the weights,
  // BF16 values,
  std::vector<RawTensor> hub;
  for (RawTensor& t : read_raw(weights)) {
    RawTensor bf16{t.name.substr(std::strlen("transformer.")), "BF16", t.shape, {}};
    for (size_t i = 0; i < t.data.size(); i += 4) {
      float x;
      std::memcpy(&x, t.data.data() + i, 4);
      const uint16_t bits = core::bf16_from_float(x).bits;
      bf16.data.insert(bf16.data.end(), reinterpret_cast<const char*>(&bits),
                       reinterpret_cast<const char*>(&bits) + 2);
    }
    hub.push_back(std::move(bf16));
  }
  // and the tied output projection saved as a copy of the embedding, as some files carry it.
  ASSERT_EQ(hub[0].name, "wte.weight");
  hub.push_back({"lm_head.weight", hub[0].dtype, hub[0].shape, hub[0].data});
  hub.push_back({"h.0.attn.bias", "F32", {1, 1, 4, 4}, std::vector<char>(64)});
  hub.push_back({"h.1.attn.masked_bias", "F32", {}, std::vector<char>(4)});
  write_raw(weights, hub);

  models::GPT2 b(kGpt2, *backend_, kFP32, 2);
  EXPECT_EQ(import_error(dir, b), "");
  std::vector<float> expected = masters(a);
  for (float& x : expected) x = core::bf16_to_float(core::bf16_from_float(x));
  EXPECT_EQ(masters(b), expected);
}

TEST_F(HfWeights, TensorProblemsAreNamed) {
  models::GPT2 a(kGpt2, *backend_, kFP32, 1);
  const std::string dir = export_model(a, "gpt2");
  const std::string weights = dir + "/model.safetensors";
  const std::vector<RawTensor> good = read_raw(weights);
  models::GPT2 b(kGpt2, *backend_, kFP32, 2);
  const std::vector<float> before = masters(b);

  auto expect = [&](std::vector<RawTensor> tensors, const std::string& part) {
    write_raw(weights, tensors);
    const std::string e = import_error(dir, b);
    EXPECT_NE(e.find("'" + weights + "'"), std::string::npos) << e;
    EXPECT_NE(e.find(part), std::string::npos) << "expected '" << part << "' in '" << e << "'";
    EXPECT_EQ(masters(b), before) << "a refused import changes nothing";
  };
  {
    auto t = good;
    t.erase(t.begin() + 5);
    expect(t, "tensor '" + good[5].name + "' is missing (GPT-2 needs it for ");
  }
  {
    auto t = good;
    t.push_back({"transformer.h.2.ln_1.weight", "F32", {8}, std::vector<char>(32)});
    expect(t,
           "tensor 'transformer.h.2.ln_1.weight' is not a parameter of this GPT-2 "
           "(GPT2LMHeadModel)");
  }
  {
    // The tied output projection, but not a copy of the embedding.
    auto t = good;
    ASSERT_EQ(t[0].name, "transformer.wte.weight");
    t.push_back({"lm_head.weight", "F32", {10, 8}, std::vector<char>(320)});
    expect(t,
           "tensor 'lm_head.weight' differs from 'transformer.wte.weight', which this GPT-2 "
           "ties it to (tie_word_embeddings): one matrix serves both");
  }
  {
    auto t = good;
    t.push_back(good[0]);
    t.back().name = "wte.weight";
    expect(t, "tensor 'transformer.wte.weight' is there twice");
  }
  {
    auto t = good;
    ASSERT_EQ(t[0].name, "transformer.wte.weight");
    t[0].shape = {8, 10};  // the embedding stored transposed
    expect(t, "tensor 'transformer.wte.weight' is [8, 10], the model needs [10, 8]");
  }
  {
    auto t = good;
    t[1].dtype = "I32";
    expect(t, "tensor '" + good[1].name + "' has dtype I32; F32, BF16 and F16 weights are read");
  }
  {
    // A NaN would end training at its first step, blaming the learning rate.
    auto t = good;
    const float nan = NAN;
    std::memcpy(t[1].data.data() + 3 * sizeof(float), &nan, sizeof(float));
    expect(t, "tensor '" + good[1].name + "' element 3 is nan");
  }
  {
    // Cut short: the reader names the file and the tensor past its end.
    write_raw(weights, good);
    std::string bytes = read_text(weights);
    write_text(weights, bytes.substr(0, bytes.size() - 100));
    const std::string e = import_error(dir, b);
    EXPECT_NE(e.find("safetensors '" + weights + "': truncated: tensor"), std::string::npos) << e;
  }
  fs::remove(weights);
  EXPECT_NE(import_error(dir, b).find("cannot open"), std::string::npos);
  EXPECT_EQ(masters(b), before);
}

// The weights in two shards named by model.safetensors.index.json, as transformers writes a
// checkpoint past its max_shard_size: the same import as from one file.
TEST_F(HfWeights, ReadsShardedCheckpoints) {
  models::GPT2 a(kGpt2, *backend_, kFP32, 1);
  const std::string dir = export_model(a, "gpt2");
  const std::string weights = dir + "/model.safetensors";
  const std::vector<RawTensor> all = read_raw(weights);
  ASSERT_GT(all.size(), 2u);
  fs::remove(weights);
  const size_t half = all.size() / 2;
  const std::string first = "model-00001-of-00002.safetensors";
  const std::string second = "model-00002-of-00002.safetensors";
  write_raw(dir + "/" + first, {all.begin(), all.begin() + static_cast<std::ptrdiff_t>(half)});
  write_raw(dir + "/" + second, {all.begin() + static_cast<std::ptrdiff_t>(half), all.end()});
  const std::string index = dir + "/model.safetensors.index.json";
  auto write_index = [&](const std::vector<std::pair<std::string, std::string>>& map) {
    std::string text = "{\"metadata\": {\"total_size\": 0}, \"weight_map\": {";
    for (size_t i = 0; i < map.size(); ++i)
      text += (i ? ", \"" : "\"") + map[i].first + "\": \"" + map[i].second + "\"";
    write_text(index, text + "}}");
  };
  std::vector<std::pair<std::string, std::string>> map;
  for (size_t i = 0; i < all.size(); ++i) map.emplace_back(all[i].name, i < half ? first : second);
  write_index(map);

  models::GPT2 b(kGpt2, *backend_, kFP32, 2);
  EXPECT_EQ(import_error(dir, b), "");
  EXPECT_EQ(masters(b), masters(a));

  // A shard the index does not name leaves its tensors missing; the error names the index.
  models::GPT2 c(kGpt2, *backend_, kFP32, 3);
  const std::vector<float> before = masters(c);
  std::vector<std::pair<std::string, std::string>> only_first(map.begin(), map.begin() + half);
  write_index(only_first);
  const std::string missing = import_error(dir, c);
  EXPECT_NE(missing.find("'" + index + "': tensor '" + all[half].name + "' is missing"),
            std::string::npos)
      << missing;
  // A tensor in two shards, a name outside the directory, an index without a weight_map.
  write_raw(dir + "/" + second, {all.begin() + static_cast<std::ptrdiff_t>(half - 1), all.end()});
  write_index(map);
  EXPECT_NE(import_error(dir, c).find("tensor '" + all[half - 1].name + "' is there twice"),
            std::string::npos)
      << import_error(dir, c);
  write_index({{all[0].name, "../elsewhere.safetensors"}});
  EXPECT_NE(import_error(dir, c).find("'" + index + "': tensor '" + all[0].name +
                                      "' maps to \"../elsewhere.safetensors\", not the name of "
                                      "a file in " +
                                      dir),
            std::string::npos)
      << import_error(dir, c);
  write_text(index, "{}");
  EXPECT_NE(
      import_error(dir, c).find("'" + index + "': not a JSON object with a \"weight_map\" object"),
      std::string::npos)
      << import_error(dir, c);
  EXPECT_EQ(masters(c), before) << "a refused import changes nothing";
}

TEST_F(HfWeights, ConfigFieldsMustAgree) {
  models::GPT2 a(kGpt2, *backend_, kFP32, 1);
  models::GPT2 b(kGpt2, *backend_, kFP32, 2);
  const std::string dir = export_model(a, "gpt2");
  const std::string config = dir + "/config.json";
  const std::string good = read_text(config);
  auto expect = [&](const std::string& key, const std::string& line, const std::string& part) {
    write_text(config, good);
    edit_config(dir, key, line);
    const std::string e = import_error(dir, b);
    EXPECT_NE(e.find("'" + config + "': " + part), std::string::npos)
        << "expected '" << part << "' in '" << e << "'";
  };
  expect("n_head", "\"n_head\": 4", "n_head = 4 disagrees with model.gpt2.n_head = 2");
  expect("n_positions", "\"n_positions\": 1024",
         "n_positions = 1024 disagrees with model.gpt2.seq_len = 4");
  expect("activation_function", "\"activation_function\": \"relu\"",
         "activation_function = \"relu\" disagrees with mantissa's GPT-2 has \"gelu_new\"");
  expect("model_type", "\"model_type\": \"llama\"", "model_type = \"llama\" disagrees");
  expect("model_type", "", "no \"model_type\" field (GPT-2 needs it)");
  // Absent fields take transformers' defaults: n_embd 768 is not ours, layer_norm_epsilon
  // 1e-5 and n_inner null are.
  expect("n_embd", "",
         "n_embd = 768 (absent: transformers' default) disagrees with model.gpt2.n_embd = 8");
  for (const char* key : {"layer_norm_epsilon", "n_inner", "architectures", "n_ctx"}) {
    write_text(config, good);
    edit_config(dir, key, "");
    EXPECT_EQ(import_error(dir, b), "") << key;
  }
  // A null that transformers keeps as None, which is not its default: GPT-2 then does not
  // scale the attention scores.
  expect("scale_attn_weights", "\"scale_attn_weights\": null",
         "scale_attn_weights = null disagrees with mantissa's GPT-2 has true");
  // n_inner written out: 4 n_embd is what null means; another width is not our MLP.
  write_text(config, good);
  edit_config(dir, "n_inner", "\"n_inner\": " + std::to_string(4 * kGpt2.n_embd));
  EXPECT_EQ(import_error(dir, b), "");
  expect("n_inner", "\"n_inner\": " + std::to_string(2 * kGpt2.n_embd),
         "n_inner = " + std::to_string(2 * kGpt2.n_embd) +
             " disagrees with mantissa's GPT-2 has null");
  // Another tool's float text for the same value.
  write_text(config, good);
  edit_config(dir, "layer_norm_epsilon", "\"layer_norm_epsilon\": 9.999999747378752e-06");
  EXPECT_EQ(import_error(dir, b), "");
  write_text(config, "{\"n_head\": ");
  EXPECT_NE(import_error(dir, b).find("is not a JSON object"), std::string::npos);
  write_text(config, "[1, 2]");
  EXPECT_NE(import_error(dir, b).find("is not a JSON object"), std::string::npos);
  fs::remove(config);
  EXPECT_NE(import_error(dir, b).find("config.json': cannot open: No such file"),
            std::string::npos);
}

TEST_F(HfWeights, LlamaConfigFields) {
  models::Llama a(models::testing::tiny_hf_llama(false), *backend_, kFP32, 1);
  models::Llama b(models::testing::tiny_hf_llama(false), *backend_, kFP32, 2);
  const std::string dir = export_model(a, "llama");
  const std::string config = dir + "/config.json";
  const std::string good = read_text(config);
  auto error = [&](const std::string& key, const std::string& line) {
    write_text(config, good);
    edit_config(dir, key, line);
    return import_error(dir, b);
  };
  // A longer trained context is fine (no tensor depends on it), a shorter one is not.
  EXPECT_EQ(error("max_position_embeddings", "\"max_position_embeddings\": 131072"), "");
  EXPECT_NE(error("max_position_embeddings", "\"max_position_embeddings\": 4")
                .find("max_position_embeddings = 4 is below model.llama.seq_len = 8"),
            std::string::npos);
  EXPECT_NE(error("rope_scaling", "\"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": 32.0}")
                .find("rope_scaling = {"),
            std::string::npos);
  EXPECT_NE(error("rope_theta", "\"rope_theta\": 10000.0")
                .find("rope_theta = 10000 disagrees with model.llama.rope_theta = 500000.0"),
            std::string::npos);
  EXPECT_NE(error("num_key_value_heads", "")
                .find("num_key_value_heads = 4 (absent: transformers' default) disagrees with "
                      "model.llama.n_kv_head = 2"),
            std::string::npos);
  // null where transformers derives the value: as absent.
  EXPECT_NE(error("num_key_value_heads", "\"num_key_value_heads\": null")
                .find("num_key_value_heads = 4 (null: transformers' default) disagrees with "
                      "model.llama.n_kv_head = 2"),
            std::string::npos);
  EXPECT_EQ(error("head_dim", "\"head_dim\": null"), "");
  // Absent: transformers' 1e-6, which is this model's.
  EXPECT_EQ(error("rms_norm_eps", ""), "");
  EXPECT_NE(error("rms_norm_eps", "\"rms_norm_eps\": 1e-05")
                .find("rms_norm_eps = 1e-05 disagrees with model.llama.norm_eps = 1e-06"),
            std::string::npos);
  EXPECT_NE(error("hidden_act", "\"hidden_act\": \"gelu\"").find("hidden_act = \"gelu\" disagrees"),
            std::string::npos);
  EXPECT_NE(error("attention_bias", "\"attention_bias\": true").find("attention_bias = true"),
            std::string::npos);
  EXPECT_EQ(error("head_dim", ""), "");
  // Transformers 5's rope_parameters in place of rope_theta and rope_scaling.
  write_text(config, good);
  edit_config(dir, "rope_scaling", "");
  const std::string without_scaling = read_text(config);
  const auto v5 = [&](const std::string& parameters) {
    write_text(config, without_scaling);
    edit_config(dir, "rope_theta", "\"rope_parameters\": " + parameters);
    return import_error(dir, b);
  };
  EXPECT_EQ(v5("{\"rope_type\": \"default\", \"rope_theta\": 500000.0}"), "");
  EXPECT_NE(v5("{\"rope_type\": \"default\", \"rope_theta\": 10000.0}")
                .find("rope_theta = 10000 disagrees with model.llama.rope_theta = 500000.0"),
            std::string::npos);
  EXPECT_NE(v5("{\"rope_type\": \"llama3\", \"rope_theta\": 500000.0, \"factor\": 32.0}")
                .find("rope_parameters.rope_type = \"llama3\": a RoPE scaling"),
            std::string::npos);
}

TEST_F(HfWeights, ExportWritesWholeDirectoriesOnly) {
  models::GPT2 a(kGpt2, *backend_, kFP32, 1);
  // A non-empty directory is refused, an empty one is filled, a trailing slash is the same.
  fs::create_directories(path("full"));
  write_text(path("full/notes.txt"), "mine");
  try {
    export_model(a, "full");
    ADD_FAILURE() << "exported into a non-empty directory";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("exists and is not empty"), std::string::npos);
  }
  EXPECT_EQ(read_text(path("full/notes.txt")), "mine");
  fs::create_directories(path("empty"));
  export_model(a, "empty/");
  EXPECT_TRUE(fs::exists(path("empty/model.safetensors")));
  EXPECT_FALSE(fs::exists(path("empty.tmp")));
  write_text(path("file"), "x");
  EXPECT_THROW(export_model(a, "file"), core::ConfigError);

  // A crashed export's DIR.tmp is replaced; a DIR.tmp holding anything else is not touched.
  fs::create_directories(path("out.tmp"));
  write_text(path("out.tmp/config.json"), "{");
  write_text(path("out.tmp/model.safetensors.4242-0.tmp"), "partial");
  export_model(a, "out");
  EXPECT_TRUE(fs::exists(path("out/config.json")));
  EXPECT_FALSE(fs::exists(path("out.tmp")));
  fs::create_directories(path("other.tmp"));
  write_text(path("other.tmp/thesis.tex"), "mine");
  EXPECT_THROW(export_model(a, "other"), core::ConfigError);
  EXPECT_FALSE(fs::exists(path("other")));
  EXPECT_EQ(read_text(path("other.tmp/thesis.tex")), "mine");

  // The tokenizer comes along, byte for byte.
  write_text(path("tok.model"), std::string("\x00\x01sentencepiece", 15));
  const std::string dir = export_model(a, "with_tokenizer", path("tok.model"));
  EXPECT_EQ(read_text(dir + "/tokenizer.model"), read_text(path("tok.model")));
}

TEST_F(HfWeights, MlpHasNoLayout) {
  models::MLP mlp({}, *backend_, kFP32, 1);
  try {
    launcher::hf_layout_of(mlp, "model.init_from");
    ADD_FAILURE() << "the MLP has a layout";
  } catch (const core::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.init_from: Hugging Face model directories hold "
                                         "GPT-2 and Llama models"),
              std::string::npos);
  }
}

// The tokenizer an export copies: data.tokenizer, else tokenizer.model beside the shards.
TEST_F(HfWeights, RunTokenizerFile) {
  TrainConfig config;
  config.mutable_data()->mutable_synthetic();
  EXPECT_EQ(launcher::run_tokenizer_file(config), std::nullopt);
  config.mutable_data()->mutable_token_shards()->set_pattern(path("shards/train_*.bin"));
  EXPECT_EQ(launcher::run_tokenizer_file(config), std::nullopt) << "no tokenizer.model there";
  fs::create_directories(path("shards"));
  write_text(path("shards/tokenizer.model"), "sp");
  EXPECT_EQ(launcher::run_tokenizer_file(config), path("shards/tokenizer.model"));
  config.mutable_data()->set_tokenizer(path("other.model"));
  EXPECT_EQ(launcher::run_tokenizer_file(config), path("other.model"));
}
