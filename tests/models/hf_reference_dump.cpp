// mantissa's side of the PyTorch reference tests (hf_reference.py): builds a GPT-2 or Llama on
// the CPU in FP32, gives it weights that exercise every tensor, exports it with `mantissa
// export --format hf`'s code, and writes a batch with mantissa's FP32 logits and loss on it.
//
//   hf_reference_dump gpt2|llama OUT_DIR key=value...
// keys: seed, batch, and the model's config fields (gpt2: n_layer n_head n_embd seq_len
// vocab_size; llama: also n_kv_head ffn_hidden rope_theta norm_eps tie_embeddings). The batch is
// batch sequences of seq_len tokens. Writes
//   OUT_DIR/hf/            model.safetensors and config.json (launcher/hf_weights.h)
//   OUT_DIR/tokens.bin     int32 [batch, seq_len + 1]: inputs are [:, :-1], targets [:, 1:]
//   OUT_DIR/logits.bin     float32 [batch * seq_len, vocab_size] (no padding columns)
//   OUT_DIR/loss.txt       the mean cross-entropy, %.17g
//
// The weights: every value a tensor of the export covers is drawn anew from `seed` — matrices
// and embeddings N(0, 0.2), norm gains 1 + N(0, 0.2), biases N(0, 0.2) — so that attention is
// far from uniform, biases and gains are not their initial 0 and 1, and a tensor mapped to the
// wrong place changes the logits. Padding rows stay zero.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>

#include "core/error.h"
#include "core/precision/policy.h"
#include "launcher/hf_weights.h"
#include "models/gpt2/gpt2.h"
#include "models/llama/llama.h"

using namespace mantissa;

namespace {

std::map<std::string, std::string> parse_keys(int argc, char** argv) {
  std::map<std::string, std::string> keys;
  for (int i = 3; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    MANTISSA_CHECK(eq != std::string::npos, "expected key=value, got " << arg);
    keys[arg.substr(0, eq)] = arg.substr(eq + 1);
  }
  return keys;
}

int64_t get(const std::map<std::string, std::string>& keys, const std::string& key) {
  const auto found = keys.find(key);
  MANTISSA_CHECK(found != keys.end(), "missing " << key << "=...");
  return std::stoll(found->second);
}

double get_double(const std::map<std::string, std::string>& keys, const std::string& key) {
  const auto found = keys.find(key);
  MANTISSA_CHECK(found != keys.end(), "missing " << key << "=...");
  return std::stod(found->second);
}

std::unique_ptr<train::LanguageModel> build(const std::string& family,
                                            const std::map<std::string, std::string>& keys,
                                            core::Backend& backend) {
  const auto policy = core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32);
  const uint64_t seed = static_cast<uint64_t>(get(keys, "seed"));
  if (family == "gpt2") {
    const models::GPT2Config c{get(keys, "n_layer"), get(keys, "n_head"), get(keys, "n_embd"),
                               get(keys, "seq_len"), get(keys, "vocab_size")};
    return std::make_unique<models::GPT2>(c, backend, policy, seed);
  }
  MANTISSA_CHECK(family == "llama", "family must be gpt2 or llama, got " << family);
  models::LlamaConfig c;
  c.n_layer = get(keys, "n_layer");
  c.n_head = get(keys, "n_head");
  c.n_kv_head = get(keys, "n_kv_head");
  c.n_embd = get(keys, "n_embd");
  c.ffn_hidden = get(keys, "ffn_hidden");
  c.seq_len = get(keys, "seq_len");
  c.vocab_size = get(keys, "vocab_size");
  c.rope_theta = get_double(keys, "rope_theta");
  c.norm_eps = static_cast<float>(get_double(keys, "norm_eps"));
  c.tie_embeddings = get(keys, "tie_embeddings") != 0;
  return std::make_unique<models::Llama>(c, backend, policy, seed);
}

// New values for every row the layout covers (see the file comment).
void draw_weights(train::ParameterStore& params, const models::HfLayout& layout, uint64_t seed,
                  core::Backend& backend) {
  std::map<std::string, int64_t> offset;
  for (const train::Parameter& p : params.all()) offset[p.spec.name] = p.offset;
  std::vector<float> masters(static_cast<size_t>(params.flat_numel()), 0.0f);
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.2f);
  std::vector<float> values;
  for (const models::HfTensor& t : layout.tensors) {
    const bool gain = t.cols == 0 && t.name.ends_with(".weight");
    values.resize(static_cast<size_t>(t.numel()));
    for (float& v : values) v = (gain ? 1.0f : 0.0f) + normal(rng);
    models::from_hf(t, values.data(), masters.data() + offset.at(t.parameter));
  }
  params.set_weights(backend, core::Tensor::wrap(masters.data(), core::Shape{params.flat_numel()},
                                                 core::DType::kF32));
}

void write_file(const std::string& path, const void* data, size_t bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  MANTISSA_CHECK(out, "cannot write " << path);
}

int run(int argc, char** argv) {
  MANTISSA_CHECK(argc >= 3, "usage: hf_reference_dump gpt2|llama OUT_DIR key=value...");
  const std::string family = argv[1], out = argv[2];
  const auto keys = parse_keys(argc, argv);
  auto backend = core::make_cpu_backend();
  std::unique_ptr<train::LanguageModel> model = build(family, keys, *backend);
  const models::HfLayout layout = launcher::hf_layout_of(*model, "hf_reference_dump");
  const uint64_t seed = static_cast<uint64_t>(get(keys, "seed"));
  draw_weights(model->parameters(), layout, seed, *backend);
  std::filesystem::remove_all(out + "/hf");  // the export refuses a directory that holds files
  launcher::export_hf_directory(out + "/hf", layout, model->parameters(), *backend, std::nullopt);

  // The batch: sequences of T + 1 tokens, inputs and next-token targets.
  const int64_t b = get(keys, "batch"), t = get(keys, "seq_len"), vocab = get(keys, "vocab_size");
  std::mt19937_64 rng(seed + 1);
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(vocab - 1));
  std::vector<int32_t> sequences(static_cast<size_t>(b * (t + 1)));
  for (int32_t& x : sequences) x = token(rng);
  std::vector<int32_t> inputs, targets;
  for (int64_t s = 0; s < b; ++s)
    for (int64_t i = 0; i < t; ++i) {
      inputs.push_back(sequences[static_cast<size_t>(s * (t + 1) + i)]);
      targets.push_back(sequences[static_cast<size_t>(s * (t + 1) + i + 1)]);
    }
  const core::Shape shape{b, t};
  train::BatchTensors batch{core::Tensor::wrap(inputs.data(), shape, core::DType::kI32),
                            core::Tensor::wrap(targets.data(), shape, core::DType::kI32)};
  train::StepContext ctx{
      *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), nullptr, {}};

  const core::Tensor logits = model->logits(ctx, batch.tokens);
  const double loss = train::mean_loss(*backend, model->forward(ctx, batch, 0.0f));
  backend->synchronize();
  const int64_t n = b * t, padded = logits.dim(1);
  MANTISSA_CHECK(logits.dim(0) == n && padded >= vocab, "logits are " << logits.describe()
                                                                      << ", expected [" << n
                                                                      << ", >= " << vocab << "]");
  std::vector<float> unpadded;
  for (int64_t r = 0; r < n; ++r) {
    const float* row = logits.data_as<float>() + r * padded;
    unpadded.insert(unpadded.end(), row, row + vocab);
  }
  write_file(out + "/tokens.bin", sequences.data(), sequences.size() * 4);
  write_file(out + "/logits.bin", unpadded.data(), unpadded.size() * 4);
  char text[64];
  std::snprintf(text, sizeof text, "%.17g\n", loss);
  write_file(out + "/loss.txt", text, std::strlen(text));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hf_reference_dump: %s\n", e.what());
    return 1;
  }
}
