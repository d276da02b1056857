// The CPU backend's environment switches (MANTISSA_CPU_BF16_GEMM, MANTISSA_CPU_AVX512_CONVERT,
// MANTISSA_CPU_AMX: 1 or unset keeps a fast path on, 0 turns it off), for code outside the backend:
// the backend reads each one where its path starts, so the launcher checks them all with the
// config, before anything runs, instead of at the first GEMM or cast that reads one, and
// make_cpu_backend() checks them too.
#pragma once

#include <string>

namespace mantissa::core {

// Reads every switch; a value other than 0 or 1 throws core::Error
// "<VARIABLE>=<value>: must be 0 (off) or 1 (on, the default)".
void check_cpu_switches();

// Which of the CPU backend's code paths run on this machine with these switches, in one line
// ("CPU paths: ..."), for the start line of a run and for every benchmark, so that figures
// from different machines can be read side by side. GEMMs with FP32 operands always run
// OpenBLAS sgemm; those with BF16 or FP8 operands run the native BF16 kernel (on AMX tiles
// where the CPU has them, else VDPBF16PS) or the AVX2/FMA kernel
// that widens them to FP32 while it packs them. Rounding to BF16 and F16 to nearest
// always runs AVX2/F16C code; stochastic rounding and FP8 casts run AVX-512 code where the CPU has
// AVX-512 F, BW, VL and DQ.
std::string cpu_paths_description();

}  // namespace mantissa::core
