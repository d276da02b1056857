// An 8 x 8 FP32 transpose in AVX2 registers, for kernels that turn rows into columns a block
// at a time (the AVX2 GEMM's packing, the attention's transposed K and V).
#pragma once

#include <immintrin.h>

#if !defined(__AVX2__)
#error "cpu_transpose8.h needs AVX2 (build with -march=x86-64-v3)"
#endif

namespace mantissa::core {

// The standard 8 x 8 transpose in three rounds of shuffles: r[i] lane j becomes r[j] lane i.
inline void transpose8(__m256 (&r)[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    s[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    s[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    s[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    s[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(s[i], s[i + 4], 0x31);
  }
}

}  // namespace mantissa::core
