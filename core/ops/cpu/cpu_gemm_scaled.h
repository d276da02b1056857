// The CPU's block-scaled FP8 GEMM (GemmParams scale modes other than kTensor), reached from
// CpuBackend::gemm after check_gemm.
#pragma once

#include "core/ops/backend.h"
#include "core/ops/gemm_checks.h"

namespace mantissa::core {

// C = alpha * sum over K-blocks of (scales x FP32 partial sum) + beta * C: see the top of
// cpu_gemm_scaled.cpp.
void gemm_block_scaled(const GemmShape& s, const Tensor& a, const Tensor& b, Tensor& c,
                       const GemmParams& p);

}  // namespace mantissa::core
