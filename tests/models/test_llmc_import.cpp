// llm.c GPT-2 model import: files written here in llm.c's layout (FP32 version 3 and BF16
// version 5) from known values are imported into our GPT-2, and every parameter is compared
// element by element; header and config mismatches are errors that name the file and field.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/dtype/dtype.h"
#include "core/error.h"
#include "core/precision/policy.h"
#include "models/gpt2/llmc_import.h"

using namespace mantissa;

namespace {

// The test model: L=2 layers, 2 heads, C=8 channels, maxT=16, vocab 10 padded to 16 in the
// file (our GPT-2 pads it to 128 itself).
constexpr int32_t kL = 2, kNH = 2, kC = 8, kMaxT = 16, kV = 10, kVp = 16;

// llm.c's 16 tensors in file order: name, elements per layer, layers, and the parameter of
// ours that layer l of it must land in (the mapping under test, restated from llm.c's
// train_gpt2.c: wte (Vp,C), wpe (maxT,C), ln1w (L,C), ln1b (L,C), qkvw (L,3C,C), qkvb (L,3C),
// attprojw (L,C,C), attprojb (L,C), ln2w (L,C), ln2b (L,C), fcw (L,4C,C), fcb (L,4C),
// fcprojw (L,C,4C), fcprojb (L,C), lnfw (C), lnfb (C)).
struct Tensor {
  const char* ours;
  int64_t per_layer;
  int64_t layers;
};
const Tensor kTensors[16] = {{"wte", kVp* kC, 1},
                             {"wpe", kMaxT* kC, 1},
                             {"h.%d.ln_1.weight", kC, kL},
                             {"h.%d.ln_1.bias", kC, kL},
                             {"h.%d.attn.c_attn.weight", 3 * kC* kC, kL},
                             {"h.%d.attn.c_attn.bias", 3 * kC, kL},
                             {"h.%d.attn.c_proj.weight", kC* kC, kL},
                             {"h.%d.attn.c_proj.bias", kC, kL},
                             {"h.%d.ln_2.weight", kC, kL},
                             {"h.%d.ln_2.bias", kC, kL},
                             {"h.%d.mlp.c_fc.weight", 4 * kC* kC, kL},
                             {"h.%d.mlp.c_fc.bias", 4 * kC, kL},
                             {"h.%d.mlp.c_proj.weight", kC * 4 * kC, kL},
                             {"h.%d.mlp.c_proj.bias", kC, kL},
                             {"ln_f.weight", kC, 1},
                             {"ln_f.bias", kC, 1}};

// A distinct value per (tensor, layer, element), exact in BF16 (at most 8 significant bits).
float value(int tensor, int64_t layer, int64_t i) {
  return static_cast<float>((tensor * 37 + layer * 11 + i * 3) % 251 - 125) / 64.0f;
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("mantissa_llmc_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// Writes an llm.c model file: header, then every tensor's elements in order.
std::string write_model(const std::string& name, int32_t version, int32_t magic = 20240326) {
  const std::string path = temp_path(name);
  std::ofstream out(path, std::ios::binary);
  int32_t header[256] = {magic, version, kMaxT, kV, kL, kNH, kC, kVp};
  out.write(reinterpret_cast<const char*>(header), sizeof header);
  for (int t = 0; t < 16; ++t) {
    for (int64_t l = 0; l < kTensors[t].layers; ++l) {
      for (int64_t i = 0; i < kTensors[t].per_layer; ++i) {
        const float v = value(t, l, i);
        if (version == 3) {
          out.write(reinterpret_cast<const char*>(&v), 4);
        } else {
          const uint16_t bits = core::bf16_from_float(v).bits;
          out.write(reinterpret_cast<const char*>(&bits), 2);
        }
      }
    }
  }
  return path;
}

std::string param_name(const char* pattern, int64_t layer) {
  char name[128];
  std::snprintf(name, sizeof name, pattern, static_cast<int>(layer));
  return name;
}

// The elements of parameter `name` taken from the file: wte's first vocab_size rows (the rest
// of it is the model's own vocabulary padding, which must be zero), every other one whole.
int64_t taken_from_file(const models::GPT2& model, const train::Parameter& p) {
  return p.spec.name == "wte" ? model.config().vocab_size * kC : p.numel();
}

// Every element of every parameter equals the value written for it, and the model's
// vocabulary padding is zero (whatever the file's padding rows hold).
void expect_imported(models::GPT2& model) {
  train::ParameterStore& params = model.parameters();
  int checked = 0;
  for (int t = 0; t < 16; ++t) {
    for (int64_t l = 0; l < kTensors[t].layers; ++l) {
      const std::string name = param_name(kTensors[t].ours, l);
      const train::Parameter* p = nullptr;
      for (const auto& q : params.all())
        if (q.spec.name == name) p = &q;
      ASSERT_NE(p, nullptr) << name;
      const float* data = p->master.data_as<float>();
      const int64_t taken = taken_from_file(model, *p);
      for (int64_t i = 0; i < p->numel(); ++i)
        ASSERT_EQ(data[i], i < taken ? value(t, l, i) : 0.0f) << name << " element " << i;
      ++checked;
    }
  }
  EXPECT_EQ(checked, params.size());
}

std::string import_error(const std::string& path, const models::GPT2Config& config) {
  auto backend = core::make_cpu_backend();
  models::GPT2 model(config, *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32),
                     1);
  try {
    models::import_llmc_gpt2(path, model, *backend);
  } catch (const core::ConfigError& e) {  // a file that does not fit: the input to fix
    EXPECT_EQ(std::string(e.what()).find(".cpp:"), std::string::npos) << e.what();
    return e.what();
  }
  return "";
}

const models::GPT2Config kConfig{
    .n_layer = kL, .n_head = kNH, .n_embd = kC, .seq_len = kMaxT, .vocab_size = kV};

}  // namespace

TEST(LlmcImport, Fp32Version3) {
  const std::string path = write_model("v3.bin", 3);
  const models::LlmcModelHeader h = models::read_llmc_header(path);
  EXPECT_EQ(h.version, 3);
  EXPECT_EQ(h.padded_vocab_size, kVp);
  EXPECT_EQ(h.num_layers, kL);
  EXPECT_EQ(h.vocab_size, kV);
  auto backend = core::make_cpu_backend();
  models::GPT2 model(kConfig, *backend,
                     core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 1);
  models::import_llmc_gpt2(path, model, *backend);
  expect_imported(model);
  std::filesystem::remove(path);
}

TEST(LlmcImport, Bf16Version5RefreshesTheComputeCopy) {
  const std::string path = write_model("v5.bin", 5);
  auto backend = core::make_cpu_backend();
  models::GPT2 model(kConfig, *backend,
                     core::PrecisionPolicy::from_mode(core::PrecisionMode::kBF16), 1);
  models::import_llmc_gpt2(path, model, *backend);
  expect_imported(model);
  // The BF16 compute copy holds the imported weights (exact in BF16), not the random init.
  const train::Parameter& wte = model.parameters()[0];
  ASSERT_EQ(wte.spec.shape, core::Shape({128, kC})) << "vocab 10 padded to 128 by the model";
  const auto* compute = wte.compute.data_as<core::bf16>();
  const int64_t taken = taken_from_file(model, wte);
  for (int64_t i = 0; i < wte.numel(); ++i)
    ASSERT_EQ(core::bf16_to_float(compute[i]), i < taken ? value(0, 0, i) : 0.0f) << i;
  std::filesystem::remove(path);
}

TEST(LlmcImport, PaddedVocabAndShorterSequences) {
  // vocab_size = padded_vocab_size keeps the file's padding rows (as vocabulary, which the
  // model pads again, to 128); seq_len 12 takes wpe's first rows.
  const std::string path = write_model("padded.bin", 3);
  auto backend = core::make_cpu_backend();
  models::GPT2Config c = kConfig;
  c.vocab_size = kVp;
  c.seq_len = 12;
  models::GPT2 model(c, *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 1);
  models::import_llmc_gpt2(path, model, *backend);
  expect_imported(model);
  std::filesystem::remove(path);
}

TEST(LlmcImport, ErrorsNameTheFileAndTheField) {
  const std::string good = write_model("good.bin", 3);
  auto contains = [](const std::string& message, const std::string& part) {
    return message.find(part) != std::string::npos;
  };

  std::string e = import_error(write_model("magic.bin", 3, 20240520), kConfig);
  EXPECT_TRUE(contains(e, "magic.bin': bad magic 20240520")) << e;
  e = import_error(write_model("version.bin", 4), kConfig);
  EXPECT_TRUE(contains(e, "version.bin': unsupported version 4")) << e;

  const std::string truncated = temp_path("truncated.bin");
  std::filesystem::copy_file(good, truncated, std::filesystem::copy_options::overwrite_existing);
  std::filesystem::resize_file(truncated, std::filesystem::file_size(good) - 1);
  e = import_error(truncated, kConfig);
  EXPECT_TRUE(contains(e, "truncated.bin': file size")) << e;
  EXPECT_TRUE(contains(e, "truncated?")) << e;

  models::GPT2Config c = kConfig;
  c.n_layer = 3;
  e = import_error(good, c);
  EXPECT_TRUE(contains(e, "num_layers = 2 does not match model.gpt2.n_layer = 3")) << e;
  c = kConfig;
  c.vocab_size = 12;
  e = import_error(good, c);
  EXPECT_TRUE(contains(e, "vocab_size = 12 matches neither")) << e;
  c = kConfig;
  c.seq_len = 32;
  e = import_error(good, c);
  EXPECT_TRUE(contains(e, "seq_len = 32 exceeds the file's max_seq_len = 16")) << e;

  // A header field out of range.
  const std::string bad_heads = temp_path("heads.bin");
  std::filesystem::copy_file(good, bad_heads, std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(bad_heads, std::ios::in | std::ios::out | std::ios::binary);
    const int32_t heads = 3;  // 8 channels are not a multiple of 3 heads
    f.seekp(5 * 4);
    f.write(reinterpret_cast<const char*>(&heads), 4);
  }
  e = import_error(bad_heads, kConfig);
  EXPECT_TRUE(contains(e, "channels = 8 is not a multiple of num_heads = 3")) << e;

  // A non-finite weight: element 5 of wte, right after the 1024-byte header.
  const std::string nan_weight = temp_path("nan.bin");
  std::filesystem::copy_file(good, nan_weight, std::filesystem::copy_options::overwrite_existing);
  {
    std::fstream f(nan_weight, std::ios::in | std::ios::out | std::ios::binary);
    const float inf = INFINITY;
    f.seekp(1024 + 5 * 4);
    f.write(reinterpret_cast<const char*>(&inf), 4);
  }
  e = import_error(nan_weight, kConfig);
  EXPECT_TRUE(contains(e, "nan.bin': wte element 5 is inf")) << e;

  for (const char* name :
       {"good.bin", "magic.bin", "version.bin", "truncated.bin", "heads.bin", "nan.bin"})
    std::filesystem::remove(temp_path(name));
}
