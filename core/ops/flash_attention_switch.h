// Which attention runs: the materialised form (Backend::attention_forward, which keeps the
// [B, H, T, T] probabilities) or flash attention (Backend::flash_attention_forward, which keeps
// only lse [B, H, T]). The environment variable MANTISSA_FLASH_ATTENTION chooses:
//   1      flash, an error where the backend has no kernel for the dtype and head size;
//   0      never flash;
//   unset  flash on a GPU wherever the backend has the kernels; on the CPU the materialised
//          form, whose fused kernel is the faster one there (flash attention saves memory
//          traffic, which is what a GPU step is short of).
// Text generation (models/decoder.h) always runs the materialised form.
#pragma once

#include <cstdint>

#include "core/ops/backend.h"

namespace mantissa::core {

enum class FlashAttentionSetting { kAuto, kNever, kAlways };

// The variable's setting; core::Error naming it when it is anything but unset, 0 or 1.
FlashAttentionSetting flash_attention_setting();

// Throws as flash_attention_setting() does (the launcher calls it before a run starts).
void check_flash_attention_switch();

// Whether attention over qkv of `dtype` with heads of `head_dim` channels runs flash on `be`;
// with the setting 1 where `be` has no kernel for them, core::Error saying why.
bool use_flash_attention(const Backend& be, DType dtype, int64_t head_dim);

// The same rule for a device known only by kind (mantissa plan), never throwing: `kernels`
// says whether it has flash kernels for the shape, and without them the answer is no.
bool flash_attention_chosen(bool on_gpu, bool kernels);

}  // namespace mantissa::core
