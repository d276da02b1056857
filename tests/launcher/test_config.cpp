// The TrainConfig front end (launcher/config/config.h, launcher/config/cli.h): text-format errors
// with positions, --set through reflection, defaults, and validation messages that name the field,
// the value and the rule. The real binary's error paths are covered by test_cli.py.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "launcher/config/cli.h"
#include "launcher/config/config.h"
#include "launcher/config/config_diff.h"
#include "launcher/config/config_translate.h"

namespace mantissa::launcher {
namespace {

// The core::ConfigError message of `f`, or "" when it does not throw.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const core::ConfigError& e) {
    return e.what();
  }
  return "";
}

TrainConfig defaulted(const std::vector<std::string>& sets = {}) {
  TrainConfig c;
  for (const std::string& s : sets) apply_override(c, s);
  apply_defaults(c, "configs/unit.pbtxt");
  return c;
}

std::string validation_error(const std::vector<std::string>& sets) {
  return error_of([&] { validate(defaulted(sets)); });
}

// An unknown field or enum value is placed where it stands (protobuf places it at the token
// after it, maybe on the next line) and said as --set says it: its path, and the fields or
// values there are. Other errors are protobuf's, at its position.
TEST(ConfigParse, ReportsFileLineAndColumn) {
  EXPECT_EQ(error_of([] { parse_config_text("run {\n  stepz: 5\n}\n", "x.pbtxt"); }),
            "x.pbtxt:2:3: run has no field 'stepz' (fields: steps, seed, dir, device, log_every, "
            "eval_every, eval_tokens)");
  EXPECT_EQ(error_of([] {
              parse_config_text("rnu { steps: 5 }", "x.pbtxt");
            }).rfind("x.pbtxt:1:1: TrainConfig has no field 'rnu' (fields: run, model, ", 0),
            0u);
  EXPECT_EQ(error_of([] { parse_config_text("precision { mode: FP7 }", "y.pbtxt"); }),
            "y.pbtxt:1:19: precision.mode must be one of FP32, BF16, FP16, FP8_HYBRID, got 'FP7'");
  // Two fields named mode: the one the value stands in. Its line, not the next token's; a
  // tab counts as protobuf counts it (to the next multiple of 8); a comment that names the
  // value, and a closed message before, are passed over.
  EXPECT_EQ(error_of([] {
              parse_config_text(
                  "precision {\n  mode: BF16 # not DYNAMO\n  fp8 { margin: 1 }\n"
                  "  loss_scale {\n\tmode: DYNAMO\n  }\n}\n",
                  "z.pbtxt");
            }),
            "z.pbtxt:5:15: precision.loss_scale.mode must be one of DYNAMIC, STATIC, NONE, got "
            "'DYNAMO'");
  const std::string syntax = error_of([] { parse_config_text("run { steps: 5", "z.pbtxt"); });
  EXPECT_EQ(syntax.rfind("z.pbtxt:1:", 0), 0u) << syntax;
  // A value the parser refuses is named by its field's path.
  EXPECT_EQ(error_of([] { parse_config_text("run { steps: ten }", "w.pbtxt"); }),
            "w.pbtxt:1:14: run.steps: Expected integer, got: ten");
  EXPECT_EQ(error_of([] {
              parse_config_text("run {\n  seed: -1\n}", "w.pbtxt");
            }).rfind("w.pbtxt:2:9: run.seed: ", 0),
            0u);
  EXPECT_EQ(
      error_of([] { parse_config_text("debug { inject_nonfinite_steps: [1, 2.5] }", "w.pbtxt"); }),
      "w.pbtxt:1:37: debug.inject_nonfinite_steps: Expected integer, got: 2.5");
  // An extension's bracket where a field name belongs holds no value of a field.
  EXPECT_EQ(error_of([] { parse_config_text("run { steps: 5 [ 7 ] }", "w.pbtxt"); }),
            "w.pbtxt:1:18: Expected identifier, got: 7");
  EXPECT_EQ(error_of([] { parse_config_text("optimizer { grad_clip: -inf [ 7 ] }", "w.pbtxt"); }),
            "w.pbtxt:1:31: Expected identifier, got: 7");
  EXPECT_EQ(
      error_of([] { parse_config_text("precision { loss_scale { init: \"x\" } }", "w.pbtxt"); }),
      "w.pbtxt:1:32: precision.loss_scale.init: Expected double, got: \"x\"");
}

TEST(ConfigParse, MissingFileIsNamed) {
  const std::string e = error_of([] { load_config_file("/nonexistent/c.pbtxt"); });
  EXPECT_EQ(e, "config '/nonexistent/c.pbtxt': cannot open: No such file or directory");
}

// A directory opens (and may read as empty): it must not pass for a config of all defaults.
TEST(ConfigParse, DirectoryIsRefused) {
  EXPECT_EQ(error_of([] { load_config_file("/tmp"); }),
            "config '/tmp': is a directory, not a file");
}

// A device would be read for ever (/dev/zero) or as nothing (/dev/null).
TEST(ConfigParse, DeviceIsRefused) {
  EXPECT_EQ(error_of([] { load_config_file("/dev/null"); }),
            "config '/dev/null': is not a regular file (a pipe or a device: write it to a file "
            "first)");
}

// What a resume reports as changed: each differing value with its path, in field order; a
// repeated field as a list; another oneof member as one entry, without its fields.
TEST(ConfigDifferences, NamesEachChangedValue) {
  const TrainConfig before = parse_config_text(
      "run { steps: 20 } model { gpt2 { n_layer: 2 } } data { synthetic {} } "
      "optimizer { adamw { lr: 0.003 } }",
      "before");
  EXPECT_TRUE(config_differences(before, before).empty());
  const TrainConfig after = parse_config_text(
      "run { steps: 25 } model { gpt2 { n_layer: 2 } } data { text_file { path: \"t\" } } "
      "optimizer { adamw { lr: 0.001 } } debug { inject_nonfinite_steps: [3, 5] }",
      "after");
  EXPECT_EQ(config_differences(before, after),
            (std::vector<std::string>{"run.steps 20 -> 25", "data.source synthetic -> text_file",
                                      "optimizer.adamw.lr 0.003 -> 0.001",
                                      "debug.inject_nonfinite_steps [] -> [3, 5]"}));
}

// After a checkpoint that does not fit the model: the model fields that differ, with the
// advice; the same model config is an earlier build's layout, which no config fixes.
TEST(ConfigDifferences, MisfitExplanationTellsAnotherModelFromAnotherLayout) {
  TrainConfig saved = parse_config_text("model { gpt2 { n_layer: 2 } } data { synthetic {} }", "t");
  apply_defaults(saved, "t");
  TrainConfig deeper = saved;
  deeper.mutable_model()->mutable_gpt2()->set_n_layer(3);
  EXPECT_EQ(misfit_explanation(to_text(saved), deeper, "advice"),
            "; its model config differs: model.gpt2.n_layer 2 -> 3 (advice)");
  EXPECT_EQ(misfit_explanation(to_text(saved), saved, "advice"),
            "; its model config is this run's, so another build of mantissa laid the parameters "
            "out otherwise: the build that wrote the checkpoint can still resume or export it");
  EXPECT_EQ(misfit_explanation("", saved, "advice"), " (advice)");
  EXPECT_EQ(misfit_explanation("not { a config", saved, "advice"), " (advice)");
}

// A checkpoint records the effective config, every field set: the fields its text lacks are
// settings an earlier build did not have, named with this run's values. The effective config
// of every model and data source lacks none.
TEST(ConfigDifferences, UnrecordedSettingsAreTheFieldsAnEarlierBuildLacked) {
  const auto listed = [](const std::string& text, const TrainConfig& config) {
    std::vector<std::string> out;
    for (const UnrecordedSetting& s : unrecorded_settings(text, config))
      out.push_back(s.path + " = " + s.value);
    return out;
  };
  for (const char* text : {"model { gpt2 {} } data { synthetic {} }",
                           "model { llama {} } data { text_file { path: \"t\" } }",
                           "model { mlp {} } data { token_shards { pattern: \"s\" } } "
                           "precision { mode: FP16 }"}) {
    TrainConfig effective = parse_config_text(text, "t");
    apply_defaults(effective, "t");
    EXPECT_EQ(listed(to_text(effective), effective), std::vector<std::string>{}) << text;
  }
  TrainConfig now = parse_config_text("data { text_file { path: \"t\" } }", "t");
  apply_defaults(now, "t");
  TrainConfig old = now;
  old.mutable_data()->mutable_text_file()->clear_val_fraction();
  old.mutable_run()->clear_eval_tokens();
  old.mutable_precision()->mutable_fp8()->clear_grad_format();
  now.mutable_run()->set_eval_tokens(64);
  EXPECT_EQ(listed(to_text(old), now),
            (std::vector<std::string>{"run.eval_tokens = 64", "data.text_file.val_fraction = 0.1",
                                      "precision.fp8.grad_format = E5M2"}));
  EXPECT_EQ(listed("not { a config", now), std::vector<std::string>{});
}

TEST(ConfigOverride, ReachesNestedFieldsEnumsBoolsAndRepeatedFields) {
  TrainConfig c = parse_config_text("model { gpt2 { n_layer: 2 } }", "t");
  apply_override(c, "model.gpt2.n_layer=3");
  apply_override(c, "precision.loss_scale.growth_factor=4.5");
  apply_override(c, "precision.mode=FP16");
  apply_override(c, "precision.fp8.amax_compute=MOST_RECENT");
  apply_override(c, "dist.overlap=false");
  apply_override(c, "run.dir=/tmp/a=b");  // only the first '=' separates
  apply_override(c, "run.seed=18446744073709551615");
  apply_override(c, "debug.inject_nonfinite_steps=5");
  apply_override(c, "debug.inject_nonfinite_steps=7");
  EXPECT_EQ(c.model().gpt2().n_layer(), 3);
  EXPECT_EQ(c.precision().loss_scale().growth_factor(), 4.5);
  EXPECT_EQ(c.precision().mode(), TrainConfig::Precision::FP16);
  EXPECT_EQ(c.precision().fp8().amax_compute(), TrainConfig::Precision::Fp8::MOST_RECENT);
  EXPECT_TRUE(c.dist().has_overlap());
  EXPECT_FALSE(c.dist().overlap());
  EXPECT_EQ(c.run().dir(), "/tmp/a=b");
  EXPECT_EQ(c.run().seed(), 18446744073709551615ull);
  ASSERT_EQ(c.debug().inject_nonfinite_steps_size(), 2);
  EXPECT_EQ(c.debug().inject_nonfinite_steps(0), 5);
  EXPECT_EQ(c.debug().inject_nonfinite_steps(1), 7);
}

TEST(ConfigOverride, AStringInDoubleQuotesLosesThem) {
  TrainConfig c = parse_config_text("", "t");
  apply_override(c, "run.dir=\"runs/a b\"");
  EXPECT_EQ(c.run().dir(), "runs/a b");
  apply_override(c, "run.dir=\"a\"b\"");  // not one quoted string: as it is
  EXPECT_EQ(c.run().dir(), "\"a\"b\"");
  apply_override(c, "run.dir='x'");
  EXPECT_EQ(c.run().dir(), "'x'");
}

TEST(ConfigOverride, MessageBodySelectsAOneofMember) {
  TrainConfig c = parse_config_text("model { gpt2 { n_layer: 2 } }", "t");
  apply_override(c, "model.mlp={hidden: 128}");
  EXPECT_TRUE(c.model().has_mlp());
  EXPECT_FALSE(c.model().has_gpt2());
  EXPECT_EQ(c.model().mlp().hidden(), 128);
  apply_override(c, "data.text_file.path=corpus.txt");
  EXPECT_EQ(c.data().text_file().path(), "corpus.txt");
  apply_override(c, "data.synthetic={}");
  EXPECT_TRUE(c.data().has_synthetic());
  EXPECT_FALSE(c.data().has_text_file());
}

TEST(ConfigOverride, ErrorsNameTheArgumentAndWhatIsAllowed) {
  const auto set_error = [](const std::string& s) {
    return error_of([&] {
      TrainConfig c;
      apply_override(c, s);
    });
  };
  EXPECT_EQ(set_error("run.stepz=5"),
            "--set run.stepz=5: run has no field 'stepz' (fields: steps, seed, dir, device, "
            "log_every, eval_every, eval_tokens)");
  EXPECT_EQ(set_error("rnu.steps=5").rfind("--set rnu.steps=5: TrainConfig has no field 'rnu'", 0),
            0u);
  EXPECT_EQ(set_error("precision.mode=FP7"),
            "--set precision.mode=FP7: mode must be one of FP32, BF16, FP16, FP8_HYBRID, got "
            "'FP7'");
  EXPECT_EQ(set_error("run.steps=ten"),
            "--set run.steps=ten: steps takes an integer (int64), got 'ten'");
  EXPECT_EQ(set_error("run.steps=5x"),
            "--set run.steps=5x: steps takes an integer (int64), got '5x'");
  EXPECT_EQ(set_error("dist.zero_stage=3000000000"),
            "--set dist.zero_stage=3000000000: value '3000000000' does not fit zero_stage (int32, "
            "-2147483648 to 2147483647)");
  EXPECT_EQ(set_error("dist.overlap=yes"),
            "--set dist.overlap=yes: overlap takes true or false, got 'yes'");
  EXPECT_EQ(set_error("optimizer.adamw.lr=fast"),
            "--set optimizer.adamw.lr=fast: lr takes a number, got 'fast'");
  EXPECT_EQ(set_error("optimizer.adamw.lr=1e400"),
            "--set optimizer.adamw.lr=1e400: value '1e400' does not fit lr (a double: magnitudes "
            "up to 1.8e+308)");
  // Too small a magnitude rounds to 0, as in a config file.
  TrainConfig tiny;
  apply_override(tiny, "optimizer.adamw.weight_decay=-1e-400");
  EXPECT_EQ(tiny.optimizer().adamw().weight_decay(), 0.0);
  EXPECT_EQ(set_error("run.steps"), "--set run.steps: expected path.to.field=value");
  EXPECT_EQ(set_error("run.steps.x=1"),
            "--set run.steps.x=1: run.steps is a value, not a message with fields");
  // A message body's unknown field or enum value, named by its path in the config.
  EXPECT_EQ(set_error("model.mlp={hiden: 1}"),
            "--set model.mlp={hiden: 1}: mlp value:1:1: model.mlp has no field 'hiden' (fields: "
            "n_embd, hidden, seq_len, vocab_size)");
  EXPECT_EQ(set_error("precision={loss_scale {mode: BOGUS}}"),
            "--set precision={loss_scale {mode: BOGUS}}: precision value:1:19: "
            "precision.loss_scale.mode must be one of DYNAMIC, STATIC, NONE, got 'BOGUS'");
}

TEST(ConfigDefaults, FillEveryFieldOfTheChosenOneofsOnly) {
  const TrainConfig c = defaulted();
  EXPECT_TRUE(c.model().has_gpt2());
  EXPECT_TRUE(c.data().has_synthetic());
  EXPECT_EQ(c.run().steps(), 1000);
  EXPECT_EQ(c.run().dir(), "runs/unit");
  EXPECT_EQ(c.model().gpt2().n_embd(), 384);
  EXPECT_EQ(c.optimizer().adamw().lr(), 6e-4);
  EXPECT_EQ(c.precision().mode(), TrainConfig::Precision::BF16);
  EXPECT_EQ(c.precision().loss_scale().mode(), TrainConfig::Precision::LossScale::NONE);
  EXPECT_EQ(c.precision().loss_scale().max(), 16777216.0);
  EXPECT_EQ(c.dist().bucket_mb(), 25.0);
  EXPECT_TRUE(c.dist().overlap());
  EXPECT_TRUE(c.dist().has_accumulate_fp32());
  EXPECT_EQ(c.checkpoint().keep(), 3);
  EXPECT_EQ(c.metrics().bind_address(), "127.0.0.1");

  const TrainConfig mlp = defaulted({"model.mlp={}", "precision.mode=FP16", "run.steps=7"});
  EXPECT_FALSE(mlp.model().has_gpt2());
  EXPECT_EQ(mlp.model().mlp().hidden(), 256);
  EXPECT_EQ(mlp.run().steps(), 7);  // set values are kept
  EXPECT_EQ(mlp.precision().loss_scale().mode(), TrainConfig::Precision::LossScale::DYNAMIC);
  EXPECT_EQ(validation_error({"model.mlp={}"}), "");
}

TEST(ConfigDefaults, EffectiveConfigRoundTripsThroughText) {
  const TrainConfig c = defaulted({"debug.inject_nonfinite_steps=3", "run.steps=10"});
  const TrainConfig back = parse_config_text(to_text(c), "effective");
  EXPECT_EQ(back.SerializeAsString(), c.SerializeAsString());
  // Every scalar is present in the text, including those whose default is zero or false.
  const std::string text = to_text(c);
  EXPECT_NE(text.find("warmup_steps: 0"), std::string::npos) << text;
  EXPECT_NE(text.find("accumulate_fp32: false"), std::string::npos) << text;
  EXPECT_NE(text.find("synthetic {"), std::string::npos) << text;
}

TEST(ConfigDefaults, LlamaDerivesKvHeadsAndFfnWidth) {
  const TrainConfig c = defaulted({"model.llama={n_head: 8 n_embd: 512}"});
  EXPECT_EQ(c.model().llama().n_kv_head(), 8);
  EXPECT_EQ(c.model().llama().ffn_hidden(), 1408);  // 8/3 * 512 = 1365.3, up to 64s
  EXPECT_EQ(defaulted({"model.llama={}"}).model().llama().ffn_hidden(), 1024);
  const TrainConfig set = defaulted({"model.llama={n_kv_head: 2 ffn_hidden: 100}"});
  EXPECT_EQ(set.model().llama().n_kv_head(), 2);
  EXPECT_EQ(set.model().llama().ffn_hidden(), 100);
  EXPECT_FALSE(set.model().llama().tie_embeddings());
  EXPECT_EQ(set.model().llama().rope_theta(), 10000.0);
}

// The modules' option structs start from the config's defaults: a module built without a config
// (a test, a benchmark, an embedding program) runs as `mantissa train` would. The defaults are
// written in both places; this holds them together.
TEST(ConfigDefaults, TheModulesOwnDefaultsAreTheConfigs) {
  EXPECT_EQ(adamw_config(defaulted()), core::AdamWConfig{});
  // total_steps is run.steps, which a schedule of its own leaves at 1.
  core::LrScheduleConfig lr = lr_schedule_config(defaulted());
  lr.total_steps = core::LrScheduleConfig{}.total_steps;
  EXPECT_EQ(lr, core::LrScheduleConfig{});
  // FP16's default mode is the struct's (BF16 and FP32 need no scaling: NONE).
  EXPECT_EQ(loss_scaler_config(defaulted({"precision.mode=FP16"})), core::LossScalerConfig{});
  EXPECT_EQ(fp8_scaling_config(defaulted({"precision.mode=FP8_HYBRID"})), core::Fp8ScalingConfig{});
  EXPECT_EQ(dist_config(defaulted()), dist::DistConfig{});
}

// An FP32 run reduces its gradients in FP32, the reduced-precision modes in BF16; a reduce
// dtype the config sets is kept.
TEST(ConfigDefaults, TheReduceDtypeFollowsThePrecisionMode) {
  using Dist = TrainConfig::Dist;
  EXPECT_EQ(defaulted({"precision.mode=FP32"}).dist().grad_reduce_dtype(), Dist::FP32);
  for (const char* mode : {"BF16", "FP16", "FP8_HYBRID"}) {
    EXPECT_EQ(defaulted({std::string("precision.mode=") + mode}).dist().grad_reduce_dtype(),
              Dist::BF16)
        << mode;
  }
  EXPECT_EQ(defaulted({}).dist().grad_reduce_dtype(), Dist::BF16);
  EXPECT_EQ(
      defaulted({"precision.mode=FP32", "dist.grad_reduce_dtype=BF16"}).dist().grad_reduce_dtype(),
      Dist::BF16);
}

TEST(ConfigValidate, DefaultsAreValid) {
  EXPECT_EQ(validation_error({}), "");
  EXPECT_EQ(validation_error({"model.llama={}"}), "");
  EXPECT_EQ(validation_error({"precision.mode=FP8_HYBRID", "model.llama={n_kv_head: 2}"}), "");
  EXPECT_EQ(validation_error({"precision.mode=FP8_HYBRID"}), "");
  EXPECT_EQ(validation_error({"precision.mode=FP8_HYBRID", "model.mlp={}"}), "");
  // The same widths train in BF16.
  EXPECT_EQ(validation_error({"model.gpt2.n_embd=72", "model.gpt2.n_head=3"}), "");
}

TEST(ConfigValidate, NamesFieldValueAndRule) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"precision.loss_scale.growth_factor=0.5"},
       "precision.loss_scale.growth_factor = 0.5: must be > 1"},
      {{"precision.loss_scale.backoff_factor=1"},
       "precision.loss_scale.backoff_factor = 1: must lie in (0, 1)"},
      {{"precision.mode=FP16", "precision.loss_scale.init=0.5"},
       "precision.loss_scale.init = 0.5: must lie in [min, max] = [1, 16777216] for a DYNAMIC "
       "loss scale"},
      {{"precision.loss_scale.max=1e39"},
       "precision.loss_scale.max = 1e+39: must lie in [min = 1, 3.4028234663852886e+38]"},
      {{"precision.loss_scale.hysteresis=0"}, "precision.loss_scale.hysteresis = 0: must be >= 1"},
      {{"precision.fp8.amax_history_len=0"},
       "precision.fp8.amax_history_len = 0: must lie in [1, 1048576]"},
      {{"run.steps=0"}, "run.steps = 0: must be >= 1"},
      {{"optimizer.warmup_steps=-1"}, "optimizer.warmup_steps = -1: must be >= 0"},
      {{"optimizer.adamw.beta2=1"}, "optimizer.adamw.beta2 = 1: must lie in [0, 1)"},
      {{"optimizer.adamw.lr=-1"}, "optimizer.adamw.lr = -1: must be >= 0"},
      {{"optimizer.adamw.eps=nan"}, "optimizer.adamw.eps = nan: must be a finite number > 0"},
      // AdamW runs in float: a value is checked, and shown, as the float it becomes.
      {{"optimizer.adamw.eps=-1e-08"}, "optimizer.adamw.eps = -1e-08: must be > 0"},
      {{"optimizer.adamw.weight_decay=-0.1"}, "optimizer.adamw.weight_decay = -0.1: must be >= 0"},
      {{"optimizer.min_lr_ratio=1.5"}, "optimizer.min_lr_ratio = 1.5: must lie in [0, 1]"},
      {{"optimizer.grad_clip=-1"}, "optimizer.grad_clip = -1: must be >= 0"},
      {{"precision.loss_scale.min=0"}, "precision.loss_scale.min = 0: must be > 0"},
      // Values kept as floats: one that would round to 0 (a grad_clip of 0 turns clipping off),
      // to a subnormal (whose reciprocal, the unscaling factor, is inf) or to inf is refused.
      {{"optimizer.grad_clip=1e-50"},
       "optimizer.grad_clip = 1e-50: is kept as a float: its magnitude must lie in "
       "[1.1754943508222875e-38, 3.4028234663852886e+38]"},
      {{"optimizer.adamw.lr=1e39"},
       "optimizer.adamw.lr = 1e+39: is kept as a float: its magnitude must lie in "
       "[1.1754943508222875e-38, 3.4028234663852886e+38]"},
      {{"precision.loss_scale.mode=STATIC", "precision.loss_scale.init=1e-40"},
       "precision.loss_scale.init = 1e-40: is kept as a float: its magnitude must lie in "
       "[1.1754943508222875e-38, 3.4028234663852886e+38]"},
      {{"model.llama={norm_eps: 1e39}"},
       "model.llama.norm_eps = 1e+39: is kept as a float: its magnitude must lie in "
       "[1.1754943508222875e-38, 3.4028234663852886e+38]"},
      {{"model.llama={rope_theta: 1e39}"},
       "model.llama.rope_theta = 1e+39: is kept as a float: its magnitude must lie in "
       "[1.1754943508222875e-38, 3.4028234663852886e+38]"},
      {{"precision.fp8.margin=19"}, "precision.fp8.margin = 19: must lie in [0, 14]"},
      {{"dist.consistency_check_every=-1"}, "dist.consistency_check_every = -1: must be >= 0"},
      {{"model.gpt2.n_embd=100", "model.gpt2.n_head=3"},
       "model.gpt2.n_embd = 100: must be a multiple of model.gpt2.n_head = 3"},
      {{"model.gpt2.vocab_size=100"},
       "model.gpt2.vocab_size = 100: must be >= 256, the byte vocabulary of data.synthetic"},
      {{"model.gpt2.vocab_size=2000000"},
       "model.gpt2.vocab_size = 2000000: must lie in [1, 1048576]"},
      {{"data.micro_batch_size=0"}, "data.micro_batch_size = 0: must be >= 1"},
      // Sizes past the bounds that keep every product of sizes inside int64.
      {{"data.micro_batch_size=1000000000"},
       "data.micro_batch_size = 1000000000: times model.gpt2.seq_len = 256 must be at most "
       "16777216 tokens per micro-batch"},
      {{"data.grad_accum_steps=9223372036854775807"},
       "data.grad_accum_steps = 9223372036854775807: must lie in [1, 1048576]"},
      {{"model.gpt2.n_embd=4611686018427387904", "model.gpt2.n_head=2"},
       "model.gpt2.n_embd = 4611686018427387904: must lie in [1, 1048576]"},
      {{"model.gpt2.n_layer=100000"}, "model.gpt2.n_layer = 100000: must lie in [1, 65536]"},
      {{"model.llama={n_head: 8192}"}, "model.llama.n_head = 8192: must lie in [1, 4096]"},
      {{"data.synthetic.n_tokens=100"},
       "data.synthetic.n_tokens = 100: must lie in [model.gpt2.seq_len + 1 = 257, 2147483648] (a "
       "window of seq_len + 1 tokens at least; generated in memory)"},
      {{"data.synthetic.n_tokens=9223372036854775807"},
       "data.synthetic.n_tokens = 9223372036854775807: must lie in [model.gpt2.seq_len + 1 = "
       "257, 2147483648] (a window of seq_len + 1 tokens at least; generated in memory)"},
      {{"data.synthetic.val_tokens=1"},
       "data.synthetic.val_tokens = 1: must be 0 (none) or lie in [model.gpt2.seq_len + 1 = 257, "
       "2147483648] (a window of seq_len + 1 tokens at least; generated in memory)"},
      {{"data.text_file.path=/nonexistent/corpus.txt"},
       "data.text_file.path = \"/nonexistent/corpus.txt\": cannot be read: No such file or "
       "directory"},
      {{"data.text_file.path=/"}, "data.text_file.path = \"/\": is a directory, not a file"},
      {{"run.dir=/tmp/.."},
       "run.dir = \"/tmp/..\": is the file system's root: name a directory of the run's own (an "
       "unset variable before a slash, as in run.dir=$DIR/, gives this)"},
      {{"data.token_shards.pattern=/nonexistent/*.bin"},
       "data.token_shards.pattern = \"/nonexistent/*.bin\": matches no file"},
      {{"dist.zero_stage=2"}, "dist.zero_stage = 2: must lie in [0, 1]"},
      {{"dist.bucket_mb=0"}, "dist.bucket_mb = 0: must lie in (0, 65536]"},
      {{"dist.timeout_s=-1"}, "dist.timeout_s = -1: must be a finite number >= 1 (seconds)"},
      {{"dist.timeout_s=0.01"}, "dist.timeout_s = 0.01: must be a finite number >= 1 (seconds)"},
      // AdamW's settings are floats: named as written, not as their float rounding.
      {{"optimizer.adamw.beta1=0.99999999999"},
       "optimizer.adamw.beta1 = 0.99999999999: rounds to 1 as a float, which AdamW keeps it as: "
       "at most 0.99999994"},
      {{"optimizer.adamw.eps=1e-50"},
       "optimizer.adamw.eps = 1e-50: is kept as a float: its magnitude must lie in "
       "[1.1754943508222875e-38, 3.4028234663852886e+38]"},
      {{"optimizer.adamw.weight_decay=1e39"},
       "optimizer.adamw.weight_decay = 1e+39: is kept as a float: its magnitude must lie in "
       "[1.1754943508222875e-38, 3.4028234663852886e+38]"},
      {{"checkpoint.keep=-1"}, "checkpoint.keep = -1: must be >= 0"},
      {{"metrics.port=70000"}, "metrics.port = 70000: must lie in [0, 65535]"},
      // A control character in a value is escaped: the message stays one line.
      {{"metrics.job=a\nb"},
       "metrics.job = \"a\\nb\": must be a name of letters, digits and _ . : - (the "
       "Pushgateway's job label)"},
      {{"metrics.pushgateway_url=http://a b:9091"},
       "metrics.pushgateway_url = \"http://a b:9091\": must hold no spaces or controls"},
      {{"metrics.pushgateway_url=localhost:9091"},
       "metrics.pushgateway_url = \"localhost:9091\": must start with http:// or https://"},
      {{"metrics.pushgateway_url=http://gateway:9091/metrics"},
       "metrics.pushgateway_url = \"http://gateway:9091/metrics\": must be http://host[:port], "
       "without a path"},
      {{"run.steps=10", "debug.inject_nonfinite_steps=3", "debug.inject_nonfinite_steps=10"},
       "debug.inject_nonfinite_steps[1] = 10: must lie in [0, 9]"},
      {{"precision.mode=FP8_HYBRID", "model.gpt2.n_embd=72", "model.gpt2.n_head=3"},
       "model.gpt2.n_embd = 72: must be a multiple of 16 with precision.mode = FP8_HYBRID (FP8 "
       "GEMMs read 16-byte rows)"},
      {{"precision.mode=FP8_HYBRID", "model.gpt2.seq_len=100", "data.micro_batch_size=2"},
       "data.micro_batch_size = 2: times model.gpt2.seq_len = 100 (200 tokens) must be a multiple "
       "of 16 with precision.mode = FP8_HYBRID (the tokens are the K of the FP8 weight-gradient "
       "GEMMs)"},
      {{"precision.mode=FP8_HYBRID", "model.mlp={hidden: 100}"},
       "model.mlp.hidden = 100: must be a multiple of 16 with precision.mode = FP8_HYBRID (FP8 "
       "GEMMs read 16-byte rows)"},
      {{"model.llama={n_head: 5}"},
       "model.llama.n_embd = 384: must be a multiple of model.llama.n_head = 5"},
      {{"model.llama={n_head: 4 n_embd: 36}"},
       "model.llama.n_embd = 36: divided by model.llama.n_head = 4 gives the head dimension 9, "
       "which must be even (RoPE rotates channel pairs)"},
      {{"model.llama={n_head: 6 n_kv_head: 4}"},
       "model.llama.n_kv_head = 4: must divide model.llama.n_head = 6"},
      {{"model.llama={n_kv_head: 0}"}, "model.llama.n_kv_head = 0: must lie in [1, 4096]"},
      {{"model.llama={rope_theta: 1}"}, "model.llama.rope_theta = 1: must be finite and > 1"},
      {{"model.llama={norm_eps: 0}"}, "model.llama.norm_eps = 0: must be finite and > 0"},
      {{"model.llama={vocab_size: 100}"},
       "model.llama.vocab_size = 100: must be >= 256, the byte vocabulary of data.synthetic"},
      {{"precision.mode=FP8_HYBRID", "model.llama={ffn_hidden: 1000}"},
       "model.llama.ffn_hidden = 1000: must be a multiple of 16 with precision.mode = FP8_HYBRID "
       "(FP8 GEMMs read 16-byte rows)"},
      {{"precision.mode=FP8_HYBRID", "model.llama={n_head: 12 n_kv_head: 1 n_embd: 48}"},
       "model.llama.n_kv_head = 1: times 2 head dimensions (8, the k and v rows of the fused "
       "q|k|v projection) must be a multiple of 16 with precision.mode = FP8_HYBRID (FP8 GEMMs "
       "read 16-byte rows)"},
  };
  for (const auto& [sets, expected] : cases) {
    EXPECT_EQ(validation_error(sets), expected) << "sets: " << sets.front();
  }
}

// The FP8 recipes: their defaults, the options each takes, and the block shapes they need.
TEST(ConfigValidate, Fp8RecipesNameFieldAndRule) {
  using Fp8 = TrainConfig::Precision::Fp8;
  EXPECT_EQ(defaulted().precision().fp8().grad_format(), Fp8::E5M2);
  EXPECT_FALSE(defaulted().precision().fp8().power_of_two_scales());
  EXPECT_EQ(defaulted({"precision.fp8.recipe=BLOCKWISE"}).precision().fp8().grad_format(),
            Fp8::E4M3);
  EXPECT_TRUE(defaulted({"precision.fp8.recipe=MXFP8"}).precision().fp8().power_of_two_scales());
  for (const char* recipe : {"BLOCKWISE", "ROWWISE", "MXFP8"}) {
    const std::string set = std::string("precision.fp8.recipe=") + recipe;
    EXPECT_EQ(validation_error({"precision.mode=FP8_HYBRID", set}), "") << recipe;
    EXPECT_EQ(validation_error({"precision.mode=FP8_HYBRID", set, "model.llama={}"}), "") << recipe;
  }
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"precision.mode=FP8_HYBRID", "precision.fp8.recipe=BLOCKWISE", "model.gpt2.n_embd=192",
        "model.gpt2.n_head=3"},
       "model.gpt2.n_embd = 192: must be a multiple of 128 with precision.mode = FP8_HYBRID and "
       "precision.fp8.recipe = BLOCKWISE (the K of its FP8 GEMMs must be whole 128-element "
       "scale blocks)"},
      {{"precision.mode=FP8_HYBRID", "precision.fp8.recipe=BLOCKWISE", "model.gpt2.seq_len=64",
        "data.micro_batch_size=1"},
       "data.micro_batch_size = 1: times model.gpt2.seq_len = 64 (64 tokens) must be a multiple "
       "of 128 with precision.mode = FP8_HYBRID and precision.fp8.recipe = BLOCKWISE (the tokens "
       "are the K of the FP8 weight-gradient GEMMs)"},
      {{"precision.mode=FP8_HYBRID", "precision.fp8.recipe=MXFP8", "model.gpt2.n_embd=48",
        "model.gpt2.n_head=3"},
       "model.gpt2.n_embd = 48: must be a multiple of 32 with precision.mode = FP8_HYBRID and "
       "precision.fp8.recipe = MXFP8 (the K of its FP8 GEMMs must be whole 32-element scale "
       "blocks)"},
      {{"precision.mode=FP8_HYBRID", "precision.fp8.recipe=BLOCKWISE", "model.llama={}",
        "model.llama.ffn_hidden=1088"},
       "model.llama.ffn_hidden = 1088: must be a multiple of 128 with precision.mode = "
       "FP8_HYBRID and precision.fp8.recipe = BLOCKWISE (the K of its FP8 GEMMs must be whole "
       "128-element scale blocks)"},
      {{"precision.fp8.recipe=ROWWISE", "precision.fp8.grad_format=E5M2"},
       "precision.fp8.grad_format = E5M2: must be E4M3 with recipe ROWWISE (torchao's row-wise "
       "recipe: E4M3 for every operand)"},
      {{"precision.fp8.recipe=MXFP8", "precision.fp8.power_of_two_scales=false"},
       "precision.fp8.power_of_two_scales = false: must be true with recipe MXFP8 (its E8M0 "
       "scales are powers of two)"},
      {{"precision.fp8.power_of_two_scales=true"},
       "precision.fp8.power_of_two_scales = true: applies to the BLOCKWISE, ROWWISE and MXFP8 "
       "recipes only, not DELAYED"},
      {{"precision.fp8.recipe=BLOCKWISE", "precision.fp8.margin=2"},
       "precision.fp8.margin = 2: must be 0 with recipe BLOCKWISE (block scales map each "
       "block's amax onto the format's maximum)"},
  };
  for (const auto& [sets, expected] : cases) {
    EXPECT_EQ(validation_error(sets), expected) << "sets: " << sets.front();
  }
}

TEST(ConfigValidate, ExistingDataFilesPass) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / "mantissa_cfg_test";
  std::filesystem::create_directories(dir);
  const std::string text = (dir / "corpus.txt").string();
  std::ofstream(text) << "hello world\n";
  EXPECT_EQ(validation_error({"data.text_file.path=" + text}), "");
  std::filesystem::remove_all(dir);
}

// The rule select_device applies on a GPU (launcher/device.cpp), checked here with the
// compute capabilities of an A100 and an H200 through the config's own translation.
TEST(ConfigValidate, Fp8GradientSumsNeedHopperWhereNcclSumsThem) {
  auto gpu_error = [](const std::vector<std::string>& sets, int compute_capability) {
    return error_of([&] {
      dist::validate_for_gpu(dist_config(defaulted(sets)), compute_capability, "GPU on cuda:0");
    });
  };
  EXPECT_EQ(gpu_error({"dist.grad_reduce_dtype=FP8_E4M3"}, 80),
            "dist.grad_reduce_dtype = FP8_E4M3: NCCL sums FP8 only on compute capability 9.0 or "
            "newer, and GPU on cuda:0 has 8.0: reduce in BF16, or set dist.accumulate_fp32 = true "
            "(FP8 is then only sent, and summed in FP32)");
  EXPECT_NE(gpu_error({"dist.grad_reduce_dtype=FP8_E5M2"}, 89), "");
  EXPECT_EQ(gpu_error({"dist.grad_reduce_dtype=FP8_E4M3"}, 90), "");
  EXPECT_EQ(gpu_error({"dist.grad_reduce_dtype=FP8_E4M3", "dist.accumulate_fp32=true"}, 80), "");
  EXPECT_EQ(gpu_error({"dist.grad_reduce_dtype=BF16"}, 80), "");
}

TEST(TrainArgs, ParsesBothSpellingsAndRejectsTheRest) {
  const TrainArgs a = parse_train_args("train", {"--config", "c.pbtxt", "--set", "run.steps=5",
                                                 "--set=run.seed=2", "--progress=lines"});
  EXPECT_EQ(a.config_path, "c.pbtxt");
  EXPECT_EQ(a.sets, (std::vector<std::string>{"run.steps=5", "run.seed=2"}));
  EXPECT_EQ(a.progress, metrics::ProgressMode::kLines);
  EXPECT_TRUE(parse_train_args("train", {"--help"}).help);

  const auto args_error = [](std::vector<std::string> args) {
    return error_of([&] { parse_train_args("train", args); });
  };
  EXPECT_EQ(args_error({}), "--config FILE.pbtxt is required (see mantissa train --help)");
  EXPECT_EQ(args_error({"--config", "a", "--bogus"}),
            "unknown argument '--bogus' (see mantissa train --help)");
  EXPECT_EQ(args_error({"--config"}), "--config needs a value (see mantissa train --help)");
  // A forgotten value: the next option is not taken for it.
  EXPECT_EQ(args_error({"--config", "--set", "run.steps=5"}),
            "--config needs a value, but the next argument is the option '--set' (write "
            "--config=VALUE for a value starting with --) (see mantissa train --help)");
  EXPECT_EQ(parse_train_args("train", {"--config=--odd.pbtxt"}).config_path, "--odd.pbtxt");
  EXPECT_EQ(args_error({"--config", "a", "--progress", "fancy"}),
            "--progress takes auto, live or lines, got 'fancy' (see mantissa train --help)");
  EXPECT_EQ(args_error({"--run", "runs/x"}),
            "unknown argument '--run' (see mantissa train --help)");

  // export --run DIR: the run's config.pbtxt, with run.dir where the directory is now (before
  // any --set, which wins).
  const TrainArgs run =
      parse_train_args("export", {"--set", "run.seed=3", "--run", "elsewhere/x", "--out", "w"});
  EXPECT_EQ(run.config_path, "elsewhere/x/config.pbtxt");
  EXPECT_EQ(run.sets, (std::vector<std::string>{"run.dir=elsewhere/x", "run.seed=3"}));
  const auto export_error = [](std::vector<std::string> args) {
    return error_of([&] { parse_train_args("export", args); });
  };
  EXPECT_EQ(export_error({"--run", "a", "--config", "b", "--out", "w"}),
            "--config with --run (see mantissa export --help)");
  EXPECT_EQ(export_error({"--config", "b", "--run", "a", "--out", "w"}),
            "--run with --config (see mantissa export --help)");
  EXPECT_EQ(export_error({"--run", "a", "--run", "b", "--out", "w"}),
            "--run given twice (see mantissa export --help)");
  EXPECT_EQ(export_error({"--out", "w"}),
            "--config FILE.pbtxt or --run DIR is required (see mantissa export --help)");
  // An option of one value given twice is refused, not replaced by the second.
  EXPECT_EQ(export_error({"--run", "a", "--out", "w", "--out=v"}),
            "--out given twice (see mantissa export --help)");
  EXPECT_EQ(error_of([] {
              parse_train_args("config", {"--config", "a", "--get", "run.steps", "--get", "x"});
            }),
            "--get given twice (see mantissa config --help)");
}

}  // namespace
}  // namespace mantissa::launcher
