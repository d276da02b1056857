#include "core/ops/flash_attention_switch.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace mantissa::core {
namespace {

constexpr const char* kFlashSwitch = "MANTISSA_FLASH_ATTENTION";

// The rule, for a setting already read: =1 and unset need kernels, unset also a GPU.
bool chosen(FlashAttentionSetting setting, bool on_gpu, bool kernels) {
  switch (setting) {
    case FlashAttentionSetting::kNever: return false;
    case FlashAttentionSetting::kAlways: return kernels;
    case FlashAttentionSetting::kAuto: break;
  }
  return on_gpu && kernels;
}

}  // namespace

FlashAttentionSetting flash_attention_setting() {
  const char* value = std::getenv(kFlashSwitch);
  if (value == nullptr) return FlashAttentionSetting::kAuto;
  const std::string setting(value);
  if (setting == "0") return FlashAttentionSetting::kNever;
  if (setting == "1") return FlashAttentionSetting::kAlways;
  throw Error(std::string(kFlashSwitch) + "=" + setting +
              ": must be 0 (never), 1 (always) or unset (on a GPU where the kernels exist)");
}

void check_flash_attention_switch() {
  flash_attention_setting();
}

bool flash_attention_chosen(bool on_gpu, bool kernels) {
  return chosen(flash_attention_setting(), on_gpu, kernels);
}

bool use_flash_attention(const Backend& be, DType dtype, int64_t head_dim) {
  const FlashAttentionSetting setting = flash_attention_setting();
  if (setting == FlashAttentionSetting::kNever) return false;
  const std::string unsupported = be.unsupported_flash_attention(dtype, head_dim);
  MANTISSA_REQUIRE(unsupported.empty() || setting != FlashAttentionSetting::kAlways, kConfig,
                   kFlashSwitch << "=1: " << unsupported);
  return chosen(setting, !be.device().is_cpu(), unsupported.empty());
}

}  // namespace mantissa::core
