// Per-tensor scaling state for FP8 GEMM operands.
//
// An FP8 operand is stored as code = round(value * scale) and read back as code * scale_inv.
// The scale maps the tensor's largest magnitude (amax) onto the format's largest finite value:
//   scale = (fp8_max / amax) / 2^margin,   fp8_max = 448 (E4M3) or 57344 (E5M2),
// computed in double and rounded once to float; scale_inv = 1 / scale, likewise. An amax of 0
// (no data, or an all-zero tensor) or a non-finite amax keeps the old scale; a positive amax
// is floored at 1e-12 so the scale stays finite.
//
// Recipes:
//  - kDelayed (Transformer Engine's default): every step appends each tensor's amax to a ring
//    buffer of amax_history_len entries, and the scale for the NEXT step is computed from the
//    history, either its maximum (kMax) or the newest entry (kMostRecent).
//  - kCurrent: the scale is computed from this step's amax and used for this same step; the
//    caller measures the amax before the cast and calls update() before using the scale.
//    amax_compute is ignored (it is always this step's amax), the history is still kept for
//    metrics.
//  - kBlockwise, kRowwise, kMxfp8: finer scales (core/precision/block_scaling.h). Every
//    operand is quantised where it is used, with the scales of its own blocks computed from
//    its own values (Backend::quantize_blocks): nothing is carried from step to step. Per
//    operand role (fp8_recipe_modes):
//      BLOCKWISE (DeepSeek-V3)  inputs and gradients 1x128 tiles along K, weights 128x128
//      ROWWISE (torchao)        one scale per row along K, for every operand
//      MXFP8 (OCP MX)           1x32 blocks along K with E8M0 scales, for every operand
//    The registry keeps only each operand's newest amax (a history of one entry, for the log
//    and metrics) and a scale of 1; amax_history_len and amax_compute do not apply.
//
// Step protocol, on every rank:
//   1. gather this step's amax of every tensor into one flat vector in registration order
//      (on a GPU: one device slot per tensor, read with one copy);
//   2. MAX-all-reduce that vector across the data-parallel group (one collective), so every
//      rank computes identical scales. A MAX reduction may drop a NaN (every comparison with
//      it is false): write a NaN amax as +inf before reducing;
//   3. update(amaxes).
// A non-finite amax (an overflowing backward, typically: the step is skipped anyway) leaves
// that tensor's history and scale untouched. Recording it in the history would pin a MAX
// history at inf, freezing the scale for amax_history_len steps.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/precision/block_scaling.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

// Largest finite value of an FP8 format: 448 for kE4M3, 57344 for kE5M2.
float fp8_max(DType format);

// The scale rule above for one amax. Returns old_scale when amax is 0 or not finite.
float fp8_scale_from_amax(float amax, float old_scale, float fp8_max, int margin);

enum class Fp8Recipe : uint8_t { kDelayed, kCurrent, kBlockwise, kRowwise, kMxfp8 };
enum class AmaxCompute : uint8_t { kMax, kMostRecent };

// The config's name of a recipe ("DELAYED", "BLOCKWISE", ...).
const char* fp8_recipe_name(Fp8Recipe recipe);
// BLOCKWISE, ROWWISE and MXFP8: scales per block, no history.
bool is_block_recipe(Fp8Recipe recipe);

// What a GEMM operand is to its layer: a layer's input (activation), its weight, or the
// gradient of its output.
enum class Fp8Role : uint8_t { kInput, kWeight, kGradient };

// The scale mode of each role under a recipe (kTensor for DELAYED and CURRENT).
ScaleMode fp8_scale_mode(Fp8Recipe recipe, Fp8Role role);

// The operands of a Linear layer's three GEMMs: forward (input x weight), input gradient
// (gradient x weight), weight gradient (gradient x input).
inline constexpr std::pair<Fp8Role, Fp8Role> kLinearGemmRoles[] = {
    {Fp8Role::kInput, Fp8Role::kWeight},
    {Fp8Role::kGradient, Fp8Role::kWeight},
    {Fp8Role::kGradient, Fp8Role::kInput}};

struct Fp8ScalingConfig {
  Fp8Recipe recipe = Fp8Recipe::kDelayed;
  int32_t amax_history_len = 1024;
  AmaxCompute amax_compute = AmaxCompute::kMax;
  int32_t margin = 0;  // extra headroom: the scale is divided by 2^margin
  // The output gradients' format (inputs and weights are always E4M3): E5M2 is the HYBRID
  // format of the per-tensor recipes, E4M3 what the block recipes use by default.
  DType grad_format = DType::kE5M2;
  bool power_of_two = false;  // block recipes: power-of-two scales (MXFP8's always are)

  bool operator==(const Fp8ScalingConfig&) const = default;
};

// Throws core::ConfigError "fp8.<field> = <value>: <rule>" for the first value out of its range
// (core/config_check.h): amax_history_len in [1, 2^20], margin in [0, 100] and 0 for the block
// recipes (their scales map each block's amax onto the format's maximum), grad_format E4M3 or
// E5M2 and E4M3 for ROWWISE (torchao's recipe: E4M3 for every operand), power_of_two_scales
// only for the block recipes and never false for MXFP8 (E8M0 scales are powers of two).
void validate(const Fp8ScalingConfig& config);

struct Fp8TensorState {
  std::string name;
  DType format = DType::kE4M3;
  std::vector<float> amax_history;  // ring buffer, amax_history_len entries, 0 = no data yet
  int32_t history_next = 0;         // slot the next amax is written to
  float scale = 1.0f;
  float scale_inv = 1.0f;

  bool operator==(const Fp8TensorState&) const = default;
};

// What a checkpoint stores: every tensor's state in registration order, and the recipe that
// produced it (fp8_recipe_name; empty in checkpoints written before recipes were recorded).
struct Fp8ScalingState {
  std::vector<Fp8TensorState> tensors;
  std::string recipe;

  bool operator==(const Fp8ScalingState&) const = default;
};

// Fits a tensor's amax history to `len` entries: its newest min(saved, len) entries, oldest
// first from slot 0, the rest 0 (no data), history_next after the newest. A MAX history then
// takes the maximum over what was kept, as it would have over that many steps.
void fit_history(Fp8TensorState& tensor, int32_t len);

class Fp8ScalingRegistry {
 public:
  // Validates the config (validate above). Block recipes keep a history of one entry.
  explicit Fp8ScalingRegistry(const Fp8ScalingConfig& config);

  // Registers an FP8 operand (format kE4M3 or kE5M2) with scale 1 and an empty history and
  // returns its index. Names are unique; the registration order fixes the order of the amax
  // vector, so every rank must register the same tensors in the same order.
  int add(const std::string& name, DType format);
  int size() const { return static_cast<int>(state_.tensors.size()); }
  const Fp8TensorState& tensor(int index) const;
  float newest_amax(int index) const;

  // Advances every tensor's history and scale from this step's amaxes, one per tensor in
  // registration order.
  void update(std::span<const float> amaxes);

  const Fp8ScalingConfig& config() const { return config_; }
  const Fp8ScalingState& state() const { return state_; }
  // Restores a checkpointed state; it must describe the registered tensors (same names,
  // formats, order) under this recipe (an empty recipe, from an older checkpoint, is taken for
  // this one). Histories of another length (a resume that changed amax_history_len) are fitted
  // to history_len() by fit_history.
  void set_state(const Fp8ScalingState& state);
  // The first registered tensor whose format differs from the same tensor's in `state` (a
  // checkpoint saved with another precision.fp8.grad_format), as "'<name>' was <format>, is
  // <format>"; nullopt when every format matches or the tensors are not the same ones.
  std::optional<std::string> format_change(const Fp8ScalingState& state) const;
  // Entries of each tensor's amax history: amax_history_len, or 1 for the block recipes.
  int32_t history_len() const { return history_len_; }

 private:
  Fp8ScalingConfig config_;
  int32_t history_len_ = 0;
  Fp8ScalingState state_;
};

}  // namespace mantissa::core
