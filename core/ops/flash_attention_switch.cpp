#include "core/ops/flash_attention_switch.h"

#include <cstdlib>
#include <string>

#include "core/error.h"

namespace mantissa::core {
namespace {

constexpr const char* kFlashSwitch = "MANTISSA_FLASH_ATTENTION";

enum class FlashSetting { kAuto, kNever, kAlways };

FlashSetting flash_setting() {
  const char* value = std::getenv(kFlashSwitch);
  if (value == nullptr) return FlashSetting::kAuto;
  const std::string setting(value);
  if (setting == "0") return FlashSetting::kNever;
  if (setting == "1") return FlashSetting::kAlways;
  throw Error(std::string(kFlashSwitch) + "=" + setting +
              ": must be 0 (never), 1 (always) or unset (on a GPU where the kernels exist)");
}

}  // namespace

void check_flash_attention_switch() {
  flash_setting();
}

bool flash_attention_chosen(bool on_gpu, bool kernels) {
  switch (flash_setting()) {
    case FlashSetting::kNever: return false;
    case FlashSetting::kAlways:
      MANTISSA_CHECK(kernels, kFlashSwitch << "=1: no flash-attention kernel for this shape");
      return true;
    case FlashSetting::kAuto: break;
  }
  return on_gpu && kernels;
}

bool use_flash_attention(const Backend& be, DType dtype, int64_t head_dim) {
  if (flash_setting() == FlashSetting::kNever) return false;
  const std::string unsupported = be.unsupported_flash_attention(dtype, head_dim);
  MANTISSA_CHECK(unsupported.empty() || flash_setting() != FlashSetting::kAlways,
                 kFlashSwitch << "=1: " << unsupported);
  return flash_attention_chosen(!be.device().is_cpu(), unsupported.empty());
}

}  // namespace mantissa::core
