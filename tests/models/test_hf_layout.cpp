// The Hugging Face layout tables (models/hf_layout.h): the names and shapes transformers'
// GPT2LMHeadModel and LlamaForCausalLM use, restated here from their state dicts, and the
// table of each family against a real model's parameter store: every tensor a slice of
// rows of an existing parameter, every parameter row covered exactly once except the
// vocabulary padding. to_hf and from_hf against hand-worked slices and transposes.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "core/json_string.h"
#include "core/precision/policy.h"
#include "models/gpt2/hf_layout.h"
#include "models/llama/hf_layout.h"
#include "tests/models/tiny_hf_llama.h"

using namespace mantissa;

namespace {

using Shapes = std::map<std::string, std::vector<int64_t>>;

Shapes shapes_of(const models::HfLayout& layout) {
  Shapes out;
  for (const models::HfTensor& t : layout.tensors) {
    EXPECT_TRUE(out.emplace(t.name, t.shape()).second) << t.name << " twice";
  }
  return out;
}

// Each parameter row a tensor takes, counted; rows of the vocabulary padding must have count
// 0, every other row 1.
void expect_rows_covered_once(const models::HfLayout& layout, const train::ParameterStore& params,
                              const std::map<std::string, int64_t>& padded_from) {
  std::map<std::string, const train::Parameter*> by_name;
  for (const train::Parameter& p : params.all()) by_name[p.spec.name] = &p;
  std::map<std::string, std::vector<int>> count;
  for (const models::HfTensor& t : layout.tensors) {
    const auto found = by_name.find(t.parameter);
    ASSERT_NE(found, by_name.end()) << t.name << " names no parameter: " << t.parameter;
    const core::Shape& s = found->second->spec.shape;
    ASSERT_EQ(s.rank(), t.cols ? 2 : 1) << t.name;
    if (t.cols) {
      EXPECT_EQ(s[1], t.cols) << t.name;
    }
    ASSERT_LE(t.row_begin + t.rows, s[0]) << t.name;
    std::vector<int>& c = count[t.parameter];
    c.resize(static_cast<size_t>(s[0]));
    for (int64_t r = t.row_begin; r < t.row_begin + t.rows; ++r) ++c[static_cast<size_t>(r)];
  }
  for (const train::Parameter& p : params.all()) {
    ASSERT_TRUE(count.contains(p.spec.name)) << p.spec.name << " is in no tensor";
    const auto padded = padded_from.find(p.spec.name);
    const int64_t real_rows = padded == padded_from.end() ? p.spec.shape[0] : padded->second;
    for (int64_t r = 0; r < p.spec.shape[0]; ++r)
      EXPECT_EQ(count[p.spec.name][static_cast<size_t>(r)], r < real_rows ? 1 : 0)
          << p.spec.name << " row " << r;
  }
}

std::map<std::string, std::string> config_values(const models::HfLayout& layout) {
  std::map<std::string, std::string> out;
  for (const models::HfConfigField& f : layout.config) out[f.key] = f.value;
  return out;
}

}  // namespace

TEST(HfLayout, SlicesAndTransposes) {
  // A [4, 3] parameter: rows 1..2 plain, and transposed.
  const float p[12] = {0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32};
  const models::HfTensor plain{"a", "p", 1, 2, 3, false};
  const models::HfTensor transposed{"b", "p", 1, 2, 3, true};
  EXPECT_EQ(plain.shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(transposed.shape(), (std::vector<int64_t>{3, 2}));
  float out[6];
  models::to_hf(plain, p, out);
  EXPECT_EQ(std::vector<float>(out, out + 6), (std::vector<float>{10, 11, 12, 20, 21, 22}));
  models::to_hf(transposed, p, out);
  EXPECT_EQ(std::vector<float>(out, out + 6), (std::vector<float>{10, 20, 11, 21, 12, 22}));
  float back[12] = {};
  models::from_hf(transposed, out, back);
  EXPECT_EQ(std::vector<float>(back, back + 12),
            (std::vector<float>{0, 0, 0, 10, 11, 12, 20, 21, 22, 0, 0, 0}));
  // A vector: rows are elements.
  const models::HfTensor vec{"v", "p", 2, 3, 0, false};
  EXPECT_EQ(vec.shape(), std::vector<int64_t>{3});
  models::to_hf(vec, p, out);
  EXPECT_EQ(std::vector<float>(out, out + 3), (std::vector<float>{2, 10, 11}));
}

TEST(HfLayout, JsonNumbersReadBackExactly) {
  EXPECT_EQ(models::hf_json(1e-5f), "1e-05");
  EXPECT_EQ(models::hf_json(10000.0), "10000.0");
  EXPECT_EQ(models::hf_json(500000.0), "500000.0");
  EXPECT_EQ(models::hf_json(0.1f), "0.1");
  EXPECT_EQ(models::hf_json(2.5e-7), "2.5e-07");
  EXPECT_EQ(models::hf_json(0.0), "0.0");
  EXPECT_EQ(models::hf_json(int64_t{50257}), "50257");
  EXPECT_EQ(core::json_quoted("a\"b\\c\td"), "\"a\\\"b\\\\c\\u0009d\"");
}

TEST(HfLayout, Gpt2IsGpt2LMHeadModel) {
  // L=2, C=8, 2 heads, T=4, vocab 10 (padded to 128 by the model).
  const models::GPT2Config c{
      .n_layer = 2, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab_size = 10};
  const models::HfLayout layout = models::gpt2_hf_layout(c);
  EXPECT_EQ(layout.architecture, "GPT2LMHeadModel");
  EXPECT_EQ(layout.optional_prefix, "transformer.");
  // GPT2LMHeadModel.state_dict() less the tied lm_head.weight: Conv1D weights [in, out].
  Shapes expected = {{"transformer.wte.weight", {10, 8}},
                     {"transformer.wpe.weight", {4, 8}},
                     {"transformer.ln_f.weight", {8}},
                     {"transformer.ln_f.bias", {8}}};
  for (int i = 0; i < 2; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    expected[h + "ln_1.weight"] = expected[h + "ln_1.bias"] = {8};
    expected[h + "ln_2.weight"] = expected[h + "ln_2.bias"] = {8};
    expected[h + "attn.c_attn.weight"] = {8, 24};
    expected[h + "attn.c_attn.bias"] = {24};
    expected[h + "attn.c_proj.weight"] = {8, 8};
    expected[h + "attn.c_proj.bias"] = {8};
    expected[h + "mlp.c_fc.weight"] = {8, 32};
    expected[h + "mlp.c_fc.bias"] = {32};
    expected[h + "mlp.c_proj.weight"] = {32, 8};
    expected[h + "mlp.c_proj.bias"] = {8};
  }
  EXPECT_EQ(shapes_of(layout), expected);
  for (const models::HfTensor& t : layout.tensors)
    EXPECT_EQ(t.transpose, t.cols != 0 && t.name.find(".h.") != std::string::npos) << t.name;
  EXPECT_EQ(
      std::set<std::string>(layout.ignored.begin(), layout.ignored.end()),
      (std::set<std::string>{"transformer.h.0.attn.bias", "transformer.h.0.attn.masked_bias",
                             "transformer.h.1.attn.bias", "transformer.h.1.attn.masked_bias"}));

  const auto config = config_values(layout);
  EXPECT_EQ(config.at("model_type"), "\"gpt2\"");
  EXPECT_EQ(config.at("architectures"), "[\"GPT2LMHeadModel\"]");
  EXPECT_EQ(config.at("n_embd"), "8");
  EXPECT_EQ(config.at("n_layer"), "2");
  EXPECT_EQ(config.at("n_head"), "2");
  EXPECT_EQ(config.at("n_positions"), "4");
  EXPECT_EQ(config.at("n_ctx"), "4");
  EXPECT_EQ(config.at("vocab_size"), "10");
  EXPECT_EQ(config.at("layer_norm_epsilon"), "1e-05");
  EXPECT_EQ(config.at("activation_function"), "\"gelu_new\"");
  EXPECT_EQ(config.at("tie_word_embeddings"), "true");

  auto backend = core::make_cpu_backend();
  models::GPT2 model(c, *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32), 1);
  expect_rows_covered_once(layout, model.parameters(), {{"wte", 10}});
}

TEST(HfLayout, LlamaIsLlamaForCausalLM) {
  for (const bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    const models::LlamaConfig c = models::testing::tiny_hf_llama(tied);
    const models::HfLayout layout = models::llama_hf_layout(c);
    EXPECT_EQ(layout.architecture, "LlamaForCausalLM");
    EXPECT_EQ(layout.optional_prefix, "");
    Shapes expected = {{"model.embed_tokens.weight", {10, 16}}, {"model.norm.weight", {16}}};
    if (!tied) expected["lm_head.weight"] = {10, 16};
    for (int i = 0; i < 2; ++i) {
      const std::string l = "model.layers." + std::to_string(i) + ".";
      expected[l + "input_layernorm.weight"] =
          expected[l + "post_attention_layernorm.weight"] = {16};
      expected[l + "self_attn.q_proj.weight"] = {16, 16};
      expected[l + "self_attn.k_proj.weight"] = expected[l + "self_attn.v_proj.weight"] = {8, 16};
      expected[l + "self_attn.o_proj.weight"] = {16, 16};
      expected[l + "mlp.gate_proj.weight"] = expected[l + "mlp.up_proj.weight"] = {24, 16};
      expected[l + "mlp.down_proj.weight"] = {16, 24};
    }
    EXPECT_EQ(shapes_of(layout), expected);
    // q | k | v and gate | up are row slices of the fused parameters, in that order.
    std::map<std::string, std::pair<int64_t, int64_t>> slices;
    for (const models::HfTensor& t : layout.tensors) {
      EXPECT_FALSE(t.transpose) << t.name;
      slices[t.name] = {t.row_begin, t.rows};
    }
    using Slice = std::pair<int64_t, int64_t>;
    EXPECT_EQ(slices["model.layers.1.self_attn.q_proj.weight"], (Slice{0, 16}));
    EXPECT_EQ(slices["model.layers.1.self_attn.k_proj.weight"], (Slice{16, 8}));
    EXPECT_EQ(slices["model.layers.1.self_attn.v_proj.weight"], (Slice{24, 8}));
    EXPECT_EQ(slices["model.layers.1.mlp.gate_proj.weight"], (Slice{0, 24}));
    EXPECT_EQ(slices["model.layers.1.mlp.up_proj.weight"], (Slice{24, 24}));

    const auto config = config_values(layout);
    EXPECT_EQ(config.at("model_type"), "\"llama\"");
    EXPECT_EQ(config.at("hidden_size"), "16");
    EXPECT_EQ(config.at("intermediate_size"), "24");
    EXPECT_EQ(config.at("num_hidden_layers"), "2");
    EXPECT_EQ(config.at("num_attention_heads"), "4");
    EXPECT_EQ(config.at("num_key_value_heads"), "2");
    EXPECT_EQ(config.at("head_dim"), "4");
    EXPECT_EQ(config.at("max_position_embeddings"), "8");
    EXPECT_EQ(config.at("vocab_size"), "10");
    EXPECT_EQ(config.at("rms_norm_eps"), "1e-06");
    EXPECT_EQ(config.at("rope_theta"), "500000.0");
    EXPECT_EQ(config.at("hidden_act"), "\"silu\"");
    EXPECT_EQ(config.at("tie_word_embeddings"), tied ? "true" : "false");

    auto backend = core::make_cpu_backend();
    models::Llama model(c, *backend, core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32),
                        1);
    std::map<std::string, int64_t> padded = {{"embed_tokens.weight", 10}};
    if (!tied) padded["lm_head.weight"] = 10;
    expect_rows_covered_once(layout, model.parameters(), padded);
  }
}
