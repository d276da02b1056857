// AVX-512 versions of cpu_quantize_runs.h's code kernels (sixteen lanes, masked tails), which
// cpu_quantize_runs.cpp calls instead of its AVX2 code when avx512::narrow_enabled(). Same
// contracts and results, bit for bit.
#pragma once

#include <cstdint>

#include "core/ops/cpu/cpu_quantize_runs.h"

namespace mantissa::core::quantize_runs::avx512 {

void quantize_row(const float* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const float* next);
void quantize_row(const bf16* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const bf16* next);
void quantize_row(const fp16* x, int64_t k, int64_t block_k, const Divisor* d, DType code,
                  uint8_t* out, const fp16* next);

// As quantize_columns with every lane on one method: `divide` for the division instruction,
// else the reciprocal and FMA.
void quantize_columns(const float* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool divide, DType code, uint8_t* out, const float* next);
void quantize_columns(const bf16* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool divide, DType code, uint8_t* out, const bf16* next);
void quantize_columns(const fp16* x, int64_t stride, int64_t rows, const Divisor d[kColumns],
                      bool divide, DType code, uint8_t* out, const fp16* next);

}  // namespace mantissa::core::quantize_runs::avx512
