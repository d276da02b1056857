// A native BF16 GEMM for CPUs with AVX512-BF16 (cpu_gemm.cpp's fast path for BF16 and FP8
// operands, which are all exact BF16 values).
#pragma once

#include <cstdint>

#include "core/ops/cpu/cpu_gemm_block_scales.h"
#include "core/ops/gemm_checks.h"
#include "core/tensor/tensor.h"

namespace mantissa::core {

// Below this many flops (tens of microseconds on one core) a CPU GEMM runs on one thread:
// waking the others would cost more than it saves.
inline constexpr double kGemmParallelFlops = 1 << 21;

// True when this CPU has AVX512-BF16 and the environment does not turn the kernel off with
// MANTISSA_CPU_BF16_GEMM=0 (which sends BF16 and FP8 GEMMs to the AVX2 kernel of
// cpu_gemm_avx2.h instead). They run on AMX tiles (cpu_gemm_amx.h) where amx::enabled(),
// else on VDPBF16PS.
bool bf16_gemm_enabled();

// True for the operand pairs the kernel takes: BF16 x BF16 and the FP8 pairs.
bool bf16_gemm_supports(DType a, DType b);

// c[i] = alpha * op(A[i]) op(B[i]) + beta * c[i] for each of the s.batch products, c being
// row-major [m, n] per product, FP32 or BF16 (c_dtype). Products are exact and summed in FP32
// over all of K, and alpha is applied once to the sum; beta = 0 never reads c. A BF16 c gets
// the FP32 result rounded once to nearest even, as it is stored. alpha must not be 0 (A and
// B are always read). Requires bf16_gemm_enabled() and bf16_gemm_supports(A, B).
// With `scales` (one product, s.batch = 1) the sum is the block-scaled accumulator of
// cpu_gemm_block_scales.h, each K-block's sum running over its pairs like the whole of K.
void gemm_bf16(const GemmShape& s, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
               float alpha, float beta, void* c, DType c_dtype,
               const BlockScales* scales = nullptr);
// The same with an FP32 c.
void gemm_bf16(const GemmShape& s, const Tensor& a, bool trans_a, const Tensor& b, bool trans_b,
               float alpha, float beta, float* c);

}  // namespace mantissa::core
