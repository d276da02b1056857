#include "core/precision/fp8_scaling.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "core/config_check.h"
#include "core/error.h"
#include "core/precision/fp8_scale.h"

namespace mantissa::core {

float fp8_max(DType format) {
  switch (format) {
    case DType::kE4M3: return 448.0f;
    case DType::kE5M2: return 57344.0f;
    default: break;
  }
  MANTISSA_FAIL("fp8_max: " << dtype_name(format) << " is not an FP8 format");
}

float fp8_scale_from_amax(float amax, float old_scale, float fp8_max, int margin) {
  MANTISSA_CHECK(!(amax < 0.0f), "fp8 scaling: amax must be >= 0, got " << amax);
  return fp8_scale_for(amax, old_scale, fp8_max, margin);
}

const char* fp8_recipe_name(Fp8Recipe recipe) {
  switch (recipe) {
    case Fp8Recipe::kDelayed: return "DELAYED";
    case Fp8Recipe::kCurrent: return "CURRENT";
    case Fp8Recipe::kBlockwise: return "BLOCKWISE";
    case Fp8Recipe::kRowwise: return "ROWWISE";
    case Fp8Recipe::kMxfp8: return "MXFP8";
  }
  return "?";
}

bool is_block_recipe(Fp8Recipe recipe) {
  return recipe == Fp8Recipe::kBlockwise || recipe == Fp8Recipe::kRowwise ||
         recipe == Fp8Recipe::kMxfp8;
}

ScaleMode fp8_scale_mode(Fp8Recipe recipe, Fp8Role role) {
  switch (recipe) {
    case Fp8Recipe::kBlockwise:
      return role == Fp8Role::kWeight ? ScaleMode::kBlock128 : ScaleMode::kVec128;
    case Fp8Recipe::kRowwise: return ScaleMode::kOuterVec;
    case Fp8Recipe::kMxfp8: return ScaleMode::kVec32Ue8m0;
    default: return ScaleMode::kTensor;
  }
}

void validate(const Fp8ScalingConfig& config) {
  // Every FP8 tensor keeps a float history of this length: 2^20 entries are already 4 MiB each.
  in_range("fp8.amax_history_len", config.amax_history_len, 1, 1 << 20);
  // The amax lands on fmt_max / 2^margin: past 14, E4M3's amax (448 = 2^8.8) falls below its
  // normal range (2^-6), and from 19 every operand rounds to 0 (the GEMMs then compute nothing,
  // and the scales' product later overflows to inf).
  in_range("fp8.margin", config.margin, 0, 14);
  const std::string recipe = fp8_recipe_name(config.recipe);
  const bool block = is_block_recipe(config.recipe);
  require(!block || config.margin == 0, "fp8.margin", std::to_string(config.margin),
          "must be 0 with recipe " + recipe +
              " (block scales map each block's amax onto the format's maximum)");
  const bool fp8 = config.grad_format == DType::kE4M3 || config.grad_format == DType::kE5M2;
  const std::string format =
      fp8 ? (config.grad_format == DType::kE4M3 ? "E4M3" : "E5M2") : dtype_name(config.grad_format);
  require(fp8, "fp8.grad_format", format, "must be E4M3 or E5M2");
  require(config.recipe != Fp8Recipe::kRowwise || config.grad_format == DType::kE4M3,
          "fp8.grad_format", format,
          "must be E4M3 with recipe ROWWISE (torchao's row-wise recipe: E4M3 for every operand)");
  const std::string pow2 = config.power_of_two ? "true" : "false";
  require(block || !config.power_of_two, "fp8.power_of_two_scales", pow2,
          "applies to the BLOCKWISE, ROWWISE and MXFP8 recipes only, not " + recipe);
  require(config.recipe != Fp8Recipe::kMxfp8 || config.power_of_two, "fp8.power_of_two_scales",
          pow2, "must be true with recipe MXFP8 (its E8M0 scales are powers of two)");
}

Fp8ScalingRegistry::Fp8ScalingRegistry(const Fp8ScalingConfig& config)
    : config_(config), history_len_(is_block_recipe(config.recipe) ? 1 : config.amax_history_len) {
  validate(config_);
  state_.recipe = fp8_recipe_name(config_.recipe);
}

int Fp8ScalingRegistry::add(const std::string& name, DType format) {
  MANTISSA_CHECK(is_fp8(format), "fp8 scaling: tensor '" << name << "' has format "
                                                         << dtype_name(format)
                                                         << ", expected e4m3 or e5m2");
  for (const Fp8TensorState& t : state_.tensors) {
    MANTISSA_CHECK(t.name != name, "fp8 scaling: tensor '" << name << "' registered twice");
  }
  Fp8TensorState t;
  t.name = name;
  t.format = format;
  t.amax_history.assign(history_len_, 0.0f);
  state_.tensors.push_back(std::move(t));
  return size() - 1;
}

const Fp8TensorState& Fp8ScalingRegistry::tensor(int index) const {
  MANTISSA_CHECK(index >= 0 && index < size(),
                 "fp8 scaling: tensor index " << index << " out of range [0, " << size() << ")");
  return state_.tensors[index];
}

float Fp8ScalingRegistry::newest_amax(int index) const {
  const Fp8TensorState& t = tensor(index);
  const int len = history_len_;
  return t.amax_history[(t.history_next + len - 1) % len];
}

void Fp8ScalingRegistry::update(std::span<const float> amaxes) {
  MANTISSA_CHECK(static_cast<int>(amaxes.size()) == size(),
                 "fp8 scaling: got " << amaxes.size() << " amaxes for " << size() << " tensors");
  for (int i = 0; i < size(); ++i) {
    MANTISSA_CHECK(!(amaxes[i] < 0.0f), "fp8 scaling: amax of tensor '" << state_.tensors[i].name
                                                                        << "' must be >= 0, got "
                                                                        << amaxes[i]);
  }
  const int len = history_len_;
  const bool use_history_max =
      config_.recipe == Fp8Recipe::kDelayed && config_.amax_compute == AmaxCompute::kMax;
  for (int i = 0; i < size(); ++i) {
    Fp8TensorState& t = state_.tensors[i];
    const float amax = amaxes[i];
    if (!std::isfinite(amax)) continue;
    t.amax_history[t.history_next] = amax;
    t.history_next = (t.history_next + 1) % len;
    // Block recipes scale at each use: the amax is kept for the log, the scale stays 1.
    if (is_block_recipe(config_.recipe)) continue;
    const float used =
        use_history_max ? *std::max_element(t.amax_history.begin(), t.amax_history.end()) : amax;
    t.scale = fp8_scale_from_amax(used, t.scale, fp8_max(t.format), config_.margin);
    t.scale_inv = fp8_scale_inverse(t.scale);
  }
}

std::optional<std::string> Fp8ScalingRegistry::format_change(const Fp8ScalingState& state) const {
  if (state.tensors.size() != state_.tensors.size()) return std::nullopt;
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    const Fp8TensorState& was = state.tensors[i];
    const Fp8TensorState& is = state_.tensors[i];
    if (was.name != is.name) return std::nullopt;
    if (was.format != is.format) {
      return "'" + is.name + "' was " + dtype_name(was.format) + ", is " + dtype_name(is.format);
    }
  }
  return std::nullopt;
}

void Fp8ScalingRegistry::set_state(const Fp8ScalingState& state) {
  MANTISSA_CHECK(
      state.recipe.empty() || state.recipe == state_.recipe,
      "fp8 scaling state: saved by recipe " << state.recipe << ", this run uses " << state_.recipe);
  MANTISSA_CHECK(state.tensors.size() == state_.tensors.size(),
                 "fp8 scaling state: holds " << state.tensors.size() << " tensors, the model has "
                                             << state_.tensors.size());
  for (size_t i = 0; i < state.tensors.size(); ++i) {
    const Fp8TensorState& got = state.tensors[i];
    const Fp8TensorState& want = state_.tensors[i];
    MANTISSA_CHECK(got.name == want.name && got.format == want.format,
                   "fp8 scaling state: tensor " << i << " is '" << got.name << "' ("
                                                << dtype_name(got.format) << "), the model has '"
                                                << want.name << "' (" << dtype_name(want.format)
                                                << ")");
    MANTISSA_CHECK(got.amax_history.empty() ||
                       (got.history_next >= 0 &&
                        got.history_next < static_cast<int32_t>(got.amax_history.size())),
                   "fp8 scaling state: tensor '" << got.name << "' has history position "
                                                 << got.history_next << " outside [0, "
                                                 << got.amax_history.size() << ")");
    MANTISSA_CHECK(std::isfinite(got.scale) && got.scale > 0.0f,
                   "fp8 scaling state: tensor '" << got.name << "' has scale " << got.scale
                                                 << ", expected finite and > 0");
  }
  Fp8ScalingState restored = state;
  restored.recipe = state_.recipe;
  for (Fp8TensorState& t : restored.tensors) fit_history(t, history_len_);
  state_ = std::move(restored);
}

void fit_history(Fp8TensorState& tensor, int32_t len) {
  MANTISSA_CHECK(len >= 1, "fit_history: a history of " << len << " entries");
  const auto saved = static_cast<int32_t>(tensor.amax_history.size());
  if (saved == len) return;
  // Newest first: the k-th newest sits k slots before the next one to write.
  const int32_t kept = std::min(saved, len);
  std::vector<float> history(len, 0.0f);
  for (int32_t k = 0; k < kept; ++k) {
    history[kept - 1 - k] = tensor.amax_history[(tensor.history_next - 1 - k + 2 * saved) % saved];
  }
  tensor.amax_history = std::move(history);
  tensor.history_next = kept % len;
}

}  // namespace mantissa::core
