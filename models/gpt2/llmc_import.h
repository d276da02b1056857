// Import of llm.c GPT-2 model files (karpathy/llm.c, train_gpt2.c / train_gpt2.cu) as a run's
// initial weights.
//
// The file: a header of 256 little-endian int32 — magic 20240326, version (3: FP32 weights,
// 5: BF16 weights), max_seq_len, vocab_size, num_layers, num_heads, channels,
// padded_vocab_size, the rest unused — then the 16 parameter tensors back to back, in this
// order and with these shapes (L layers, C channels, Vp padded vocab, maxT max_seq_len; every
// per-layer tensor stacks the L layers' tensors):
//   wte (Vp, C)   wpe (maxT, C)   ln1w (L, C)   ln1b (L, C)   qkvw (L, 3C, C)   qkvb (L, 3C)
//   attprojw (L, C, C)   attprojb (L, C)   ln2w (L, C)   ln2b (L, C)   fcw (L, 4C, C)
//   fcb (L, 4C)   fcprojw (L, C, 4C)   fcprojb (L, C)   lnfw (C)   lnfb (C)
// llm.c stores matrices as [out, in] and lays Q, K, V side by side in qkvw, exactly as our
// GPT-2 does, so each tensor maps onto a parameter without any transposition:
// wte -> wte, qkvw[l] -> h.<l>.attn.c_attn.weight, fcprojw[l] -> h.<l>.mlp.c_proj.weight, ...
#pragma once

#include <cstdint>
#include <string>

#include "core/ops/backend.h"
#include "models/gpt2/gpt2.h"

namespace mantissa::models {

inline constexpr int32_t kLlmcModelMagic = 20240326;
inline constexpr int32_t kLlmcVersionF32 = 3;
inline constexpr int32_t kLlmcVersionBF16 = 5;

struct LlmcModelHeader {
  int32_t version = 0;
  int32_t max_seq_len = 0;
  int32_t vocab_size = 0;
  int32_t num_layers = 0;
  int32_t num_heads = 0;
  int32_t channels = 0;
  int32_t padded_vocab_size = 0;
};

// Reads and validates the header and the file size; throws core::Error naming the file and
// the field that is wrong.
LlmcModelHeader read_llmc_header(const std::string& path);

// Overwrites the model's FP32 masters (those the parameter store keeps: all, or a ZeRO-1
// shard) and its whole compute copy with the file's weights. The
// model must match the file: same n_layer, n_head and n_embd; vocab_size equal to the file's
// vocab_size (the file's padding rows of wte are dropped) or padded_vocab_size (they are
// kept, as vocabulary); seq_len at most max_seq_len (the first seq_len rows of wpe are used,
// to train on shorter sequences). The model's own vocabulary padding (the rows of wte past
// its vocab_size, GPT2Config::padded_vocab_size) is set to zero.
// Throws core::Error naming the file and the field on any mismatch; the masters are left
// untouched unless the whole file was read.
void import_llmc_gpt2(const std::string& path, models::GPT2& model, core::Backend& backend);

}  // namespace mantissa::models
