// The AMX-BF16 tile kernel behind the native BF16 GEMM (cpu_gemm_bf16.cpp) on CPUs with
// Advanced Matrix Extensions (Intel's P-core Xeons from Sapphire Rapids on). One TDPBF16PS
// multiplies a 16 x 32 BF16 tile of A by a 32 x 16 BF16 tile of B into 16 x 16 FP32 sums: 8,192
// multiply-adds, where VDPBF16PS does 32 (bench_cpu_gemm: 5.2-5.3x OpenBLAS sgemm on one core
// of a Sapphire Rapids, where the VDPBF16PS kernel reaches 0.68x).
// Products of BF16 values are exact in FP32, the sums round to nearest even, BF16 subnormals
// read as zero and subnormal sums flush to zero, as with VDPBF16PS; the order in which one
// instruction adds its 32 products is the hardware's, so results may differ from the
// VDPBF16PS kernel's in the last bits of FP32 (both are FP32 sums of the same exact products).
#pragma once

#include <cstdint>

namespace mantissa::core::amx {

// C rows and columns per call of micro_tile: 2 x 2 tiles of 16 x 16.
inline constexpr int64_t kTileRows = 32;
inline constexpr int64_t kTileCols = 32;
// K pairs per TDPBF16PS (32 BF16 values along K).
inline constexpr int64_t kPairsPerStep = 16;

// True when the CPU has AMX-TILE and AMX-BF16, the kernel lets this process use the tile
// state, and MANTISSA_CPU_AMX is not 0. Asks the kernel once, on the first call.
bool enabled();

// Loads this thread's tile configuration (the shapes micro_tile uses); once per thread before
// its first micro_tile of a GEMM. release_thread() hands the tile state back.
void configure_thread();
void release_thread();

// Where pair p of row r of a strip (kTileRows rows of op(A)) lives: each step of kPairsPerStep
// pairs is one contiguous block of kTileRows rows of kPairsPerStep dwords (2 KiB), so that the
// two A tiles of a step are 1 KiB runs and the steps follow one another in memory.
constexpr int64_t strip_offset(int64_t r, int64_t p) {
  return p / kPairsPerStep * (kTileRows * kPairsPerStep) + r * kPairsPerStep + p % kPairsPerStep;
}

// total = strip . panel over K pairs [p0, p1) (multiples of kPairsPerStep), summed from 0:
//   strip: kTileRows rows of op(A), pair p of row r at strip[strip_offset(r, p)], each dword
//          two BF16 values (k = 2p low, 2p + 1 high);
//   panel: kTileCols columns of op(B), pair p of column c at panel[p * kTileCols + c].
// Zero-padded rows, columns and pairs contribute +0.
void micro_tile(const uint32_t* strip, const uint32_t* panel, int64_t p0, int64_t p1,
                float (&total)[kTileRows][kTileCols]);

}  // namespace mantissa::core::amx
