#include "models/gpt2/llmc_import.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "core/dtype/dtype.h"
#include "core/error.h"

namespace mantissa::models {
namespace {

constexpr int64_t kHeaderInts = 256;
constexpr int64_t kHeaderBytes = kHeaderInts * 4;

// One of the 16 tensors of the file: `layers` stacked matrices of rows x cols (cols 0: a
// vector of `rows`), and the parameter each layer's slice goes to ("%d" is the layer).
struct FileTensor {
  const char* llmc_name;
  const char* parameter;
  int64_t layers, rows, cols;
};

std::vector<FileTensor> file_tensors(const LlmcModelHeader& h) {
  const int64_t L = h.num_layers, C = h.channels;
  return {{"wte", "wte", 1, h.padded_vocab_size, C},
          {"wpe", "wpe", 1, h.max_seq_len, C},
          {"ln1w", "h.%d.ln_1.weight", L, C, 0},
          {"ln1b", "h.%d.ln_1.bias", L, C, 0},
          {"qkvw", "h.%d.attn.c_attn.weight", L, 3 * C, C},
          {"qkvb", "h.%d.attn.c_attn.bias", L, 3 * C, 0},
          {"attprojw", "h.%d.attn.c_proj.weight", L, C, C},
          {"attprojb", "h.%d.attn.c_proj.bias", L, C, 0},
          {"ln2w", "h.%d.ln_2.weight", L, C, 0},
          {"ln2b", "h.%d.ln_2.bias", L, C, 0},
          {"fcw", "h.%d.mlp.c_fc.weight", L, 4 * C, C},
          {"fcb", "h.%d.mlp.c_fc.bias", L, 4 * C, 0},
          {"fcprojw", "h.%d.mlp.c_proj.weight", L, C, 4 * C},
          {"fcprojb", "h.%d.mlp.c_proj.bias", L, C, 0},
          {"lnfw", "ln_f.weight", 1, C, 0},
          {"lnfb", "ln_f.bias", 1, C, 0}};
}

int64_t elements_per_layer(const FileTensor& t) {
  return t.rows * (t.cols ? t.cols : 1);
}

size_t element_bytes(const LlmcModelHeader& h) {
  return h.version == kLlmcVersionF32 ? 4 : 2;
}

std::string layer_name(const char* pattern, int64_t layer) {
  char name[128];
  std::snprintf(name, sizeof name, pattern, static_cast<int>(layer));
  return name;
}

}  // namespace

LlmcModelHeader read_llmc_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  MANTISSA_REQUIRE(in, kConfig, "llm.c model '" << path << "': cannot open");
  const int64_t file_size = in.tellg();
  MANTISSA_REQUIRE(file_size >= kHeaderBytes, kConfig,
                   "llm.c model '" << path << "' is truncated: " << file_size
                                   << " bytes, shorter than "
                                   << "the " << kHeaderBytes << "-byte header");
  int32_t raw[kHeaderInts];
  in.seekg(0);
  in.read(reinterpret_cast<char*>(raw), kHeaderBytes);
  MANTISSA_REQUIRE(in, kConfig, "llm.c model '" << path << "': cannot read the header");
  MANTISSA_REQUIRE(raw[0] == kLlmcModelMagic, kConfig,
                   "llm.c model '" << path << "': bad magic " << raw[0] << " (expected "
                                   << kLlmcModelMagic << "; not an llm.c GPT-2 model file)");
  MANTISSA_REQUIRE(raw[1] == kLlmcVersionF32 || raw[1] == kLlmcVersionBF16, kConfig,
                   "llm.c model '" << path << "': unsupported version " << raw[1] << " (expected "
                                   << kLlmcVersionF32 << " for FP32 or " << kLlmcVersionBF16
                                   << " for BF16 weights)");
  LlmcModelHeader h{raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], raw[7]};
  // Bounds far above any GPT-2 yet low enough that no size below can overflow.
  const struct {
    const char* name;
    int32_t value;
    int32_t max;
  } fields[] = {
      {"max_seq_len", h.max_seq_len, 1 << 20}, {"vocab_size", h.vocab_size, 1 << 24},
      {"num_layers", h.num_layers, 1 << 12},   {"num_heads", h.num_heads, 1 << 12},
      {"channels", h.channels, 1 << 16},       {"padded_vocab_size", h.padded_vocab_size, 1 << 24}};
  for (const auto& f : fields)
    MANTISSA_REQUIRE(f.value > 0 && f.value <= f.max, kConfig,
                     "llm.c model '" << path << "': header field " << f.name << " = " << f.value
                                     << " is outside [1, " << f.max << "]");
  MANTISSA_REQUIRE(h.channels % h.num_heads == 0, kConfig,
                   "llm.c model '" << path << "': header field channels = " << h.channels
                                   << " is not a multiple of num_heads = " << h.num_heads);
  MANTISSA_REQUIRE(h.padded_vocab_size >= h.vocab_size, kConfig,
                   "llm.c model '" << path
                                   << "': header field padded_vocab_size = " << h.padded_vocab_size
                                   << " is below vocab_size = " << h.vocab_size);
  int64_t elements = 0;
  for (const FileTensor& t : file_tensors(h)) elements += t.layers * elements_per_layer(t);
  const int64_t expected = kHeaderBytes + elements * static_cast<int64_t>(element_bytes(h));
  MANTISSA_REQUIRE(file_size == expected, kConfig,
                   "llm.c model '"
                       << path << "': file size " << file_size << " bytes, but the header "
                       << "describes " << elements << " "
                       << (h.version == kLlmcVersionF32 ? "FP32" : "BF16") << " parameters ("
                       << expected << " bytes; truncated?)");
  return h;
}

void import_llmc_gpt2(const std::string& path, models::GPT2& model, core::Backend& backend) {
  const LlmcModelHeader h = read_llmc_header(path);
  const models::GPT2Config& c = model.config();
  auto check_field = [&](const char* field, int64_t file_value, int64_t model_value,
                         const char* model_field) {
    MANTISSA_REQUIRE(file_value == model_value, kConfig,
                     "llm.c model '" << path << "': header field " << field << " = " << file_value
                                     << " does not match model." << model_field << " = "
                                     << model_value);
  };
  check_field("num_layers", h.num_layers, c.n_layer, "gpt2.n_layer");
  check_field("num_heads", h.num_heads, c.n_head, "gpt2.n_head");
  check_field("channels", h.channels, c.n_embd, "gpt2.n_embd");
  MANTISSA_REQUIRE(c.vocab_size == h.vocab_size || c.vocab_size == h.padded_vocab_size, kConfig,
                   "llm.c model '" << path << "': model.gpt2.vocab_size = " << c.vocab_size
                                   << " matches neither the file's vocab_size = " << h.vocab_size
                                   << " nor its padded_vocab_size = " << h.padded_vocab_size);
  MANTISSA_REQUIRE(c.seq_len <= h.max_seq_len, kConfig,
                   "llm.c model '" << path << "': model.gpt2.seq_len = " << c.seq_len
                                   << " exceeds the file's max_seq_len = " << h.max_seq_len);

  train::ParameterStore& params = model.parameters();
  std::map<std::string, int> index;
  for (int i = 0; i < params.size(); ++i) index[params[i].spec.name] = i;

  // The whole file goes into a host copy of the masters first, so a failure half-way leaves
  // the model as it was. Padding between parameters stays zero, as the store requires.
  std::vector<float> masters(static_cast<size_t>(params.flat_numel()), 0.0f);
  std::vector<char> raw;
  std::ifstream in(path, std::ios::binary);
  in.seekg(kHeaderBytes);
  int written = 0;
  for (const FileTensor& t : file_tensors(h)) {
    const int64_t n = elements_per_layer(t);
    raw.resize(static_cast<size_t>(n) * element_bytes(h));
    for (int64_t layer = 0; layer < t.layers; ++layer) {
      const std::string name = layer_name(t.parameter, layer);
      in.read(raw.data(), static_cast<std::streamsize>(raw.size()));
      MANTISSA_REQUIRE(in, kConfig,
                       "llm.c model '" << path << "': read of " << t.llmc_name << " failed");
      const auto found = index.find(name);
      MANTISSA_CHECK(found != index.end(), "llm.c import: the model has no parameter " << name);
      const train::Parameter& p = params[found->second];
      // The rows the model holds and the rows it takes from the file. wte takes the model's
      // vocabulary, vocab_size rows: the file's padding rows (llm.c pads to its own multiple)
      // are dropped and the model's own padding stays zero. wpe takes the model's seq_len rows
      // (to train on shorter sequences). Every other tensor is taken whole.
      const bool is_wte = name == "wte", is_wpe = name == "wpe";
      const int64_t rows = is_wte ? c.padded_vocab_size() : is_wpe ? c.seq_len : t.rows;
      const int64_t taken = is_wte ? c.vocab_size : rows;
      const core::Shape expected = t.cols ? core::Shape{rows, t.cols} : core::Shape{t.rows};
      MANTISSA_CHECK(p.spec.shape == expected, "llm.c import: parameter "
                                                   << name << " is " << p.spec.shape.str()
                                                   << ", the file's " << t.llmc_name << " needs "
                                                   << expected.str());
      float* dst = masters.data() + p.offset;
      const int64_t count = taken * (t.cols ? t.cols : 1);
      if (h.version == kLlmcVersionF32) {
        std::memcpy(dst, raw.data(), static_cast<size_t>(count) * 4);
      } else {
        for (int64_t i = 0; i < count; ++i) {
          core::bf16 x;
          std::memcpy(&x.bits, raw.data() + 2 * i, 2);
          dst[i] = core::bf16_to_float(x);
        }
      }
      // Training from a NaN or inf would end at its first step blaming the learning rate.
      const float* bad = std::find_if(dst, dst + count, [](float x) { return !std::isfinite(x); });
      MANTISSA_REQUIRE(bad == dst + count, kConfig,
                       "llm.c model '" << path << "': " << t.llmc_name
                                       << (t.layers > 1 ? " of layer " + std::to_string(layer) : "")
                                       << " element " << bad - dst << " is " << *bad);
      ++written;
    }
  }
  MANTISSA_CHECK(written == params.size(), "llm.c import: the file sets "
                                               << written << " parameters, the model has "
                                               << params.size());
  params.set_weights(backend, core::Tensor::wrap(masters.data(), core::Shape{params.flat_numel()},
                                                 core::DType::kF32));
}

}  // namespace mantissa::models
