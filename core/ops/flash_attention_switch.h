// Which attention runs: the materialised form (Backend::attention_forward, which keeps the
// [B, H, T, T] probabilities) or flash attention (Backend::flash_attention_forward, which keeps
// only lse [B, H, T]). The environment variable MANTISSA_FLASH_ATTENTION chooses:
//   1      flash, an error where the backend has no kernel for the dtype and head size;
//   0      never flash;
//   unset  flash on a GPU wherever the backend has the kernels; on the CPU the materialised
//          form, whose fused kernel is the faster one there (flash attention saves memory
//          traffic, which is what a GPU step is short of).
#pragma once

#include <cstdint>

#include "core/ops/backend.h"

namespace mantissa::core {

// Throws core::Error naming the variable when it is set to anything but 0 or 1 (the launcher
// calls it before a run starts).
void check_flash_attention_switch();

// Whether attention over qkv of `dtype` with heads of `head_dim` channels runs flash on `be`.
bool use_flash_attention(const Backend& be, DType dtype, int64_t head_dim);

// The same rule for a device known only by kind (mantissa plan): `kernels` says whether it has
// flash kernels for the shape; a setting of 1 where it has none throws, as use_flash_attention
// does.
bool flash_attention_chosen(bool on_gpu, bool kernels);

}  // namespace mantissa::core
