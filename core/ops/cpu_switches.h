// The CPU backend's environment switches (MANTISSA_CPU_BF16_GEMM, MANTISSA_CPU_AVX512_CONVERT:
// 1 or unset keeps a fast path on, 0 turns it off), for code outside the backend: the backend
// reads each one where its path starts, so the launcher checks them all with the config, before
// anything runs, instead of at the first GEMM or cast that reads one.
#pragma once

namespace mantissa::core {

// Reads every switch; a value other than 0 or 1 throws core::Error
// "<VARIABLE>=<value>: must be 0 (off) or 1 (on, the default)".
void check_cpu_switches();

}  // namespace mantissa::core
