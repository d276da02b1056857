// AMX-BF16 tiles (cpu_gemm_amx.h). Tile registers 0-3 hold the four 16 x 16 FP32 quarters of
// C, 4-5 the two 16-row halves of the strip, 6-7 the two 16-column halves of the panel; each
// step along K loads four operand tiles and issues four TDPBF16PS.
#include "core/ops/cpu/cpu_gemm_amx.h"

#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/ops/cpu/cpu_switch.h"

// Only these functions use AMX instructions: the rest of the library is built for AVX2, and
// they run after enabled() has seen the CPU and the kernel allow them.
#define MANTISSA_AMX gnu::target("amx-tile,amx-bf16")

namespace mantissa::core::amx {
namespace {

// Linux asks a process to request the (large) tile data state before its first use.
constexpr int kArchReqXcompPerm = 0x1023;
constexpr int kXfeatureXtiledata = 18;

bool cpu_has_amx_bf16() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
  const bool osxsave = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && ((ecx >> 27) & 1u);
  return amx_bf16 && amx_tile && osxsave;
}

// XCR0 bits 17 (XTILECFG) and 18 (XTILEDATA): the OS saves the tile state.
bool os_saves_tiles() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (lo & (3u << 17)) == (3u << 17);
}

// The layout LDTILECFG reads: palette 1, then per tile its bytes per row and its rows.
struct TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
static_assert(sizeof(TileConfig) == 64, "LDTILECFG reads 64 bytes");

}  // namespace

bool enabled() {
  static const bool on = [] {
    return env_switch_on(kAmxSwitch) && cpu_has_amx_bf16() && os_saves_tiles() &&
           syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  }();
  return on;
}

[[MANTISSA_AMX]] void configure_thread() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.bytes_per_row[t] = 64;  // 16 FP32 sums, 16 pairs of BF16, or 16 columns' pairs
    config.rows[t] = 16;
  }
  // Not _tile_loadconfig: GCC 12 declares it as reading 8 bytes, so the compiler drops the
  // stores of the shapes above as dead and LDTILECFG faults on the incomplete configuration.
  __asm__ volatile("ldtilecfg %0" : : "m"(config));
}

[[MANTISSA_AMX]] void release_thread() {
  _tile_release();
}

// Each operand tile is loaded just before its first product, so that a load waits only for
// the products still reading that tile register, and the panel's next step (32 lines, the
// next panel's first step after the last) is prefetched into L1 while the products run: the
// panels come from L2, and without it every step of B waits for L2 (on one Sapphire Rapids
// core, this order and the prefetch took the loop from 187 to 220 GFLOP/s at K = 384 and
// from 130 to 179 at K = 1536).
[[MANTISSA_AMX]] void micro_tile(const uint32_t* strip, const uint32_t* panel, int64_t p0,
                                 int64_t p1, float (&total)[kTileRows][kTileCols]) {
  constexpr int64_t kStripStride = kPairsPerStep * 4, kPanelStride = kTileCols * 4;  // bytes
  constexpr int64_t kPanelStep = kPairsPerStep * kTileCols;                          // dwords
  constexpr int64_t kLine = 16;                                                      // dwords
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t p = p0; p < p1; p += kPairsPerStep) {
    const uint32_t* a = strip + strip_offset(0, p);
    const uint32_t* b = panel + p * kTileCols;
    const char* next_b = reinterpret_cast<const char*>(b + kPanelStep);
    _tile_loadd(4, a, kStripStride);
    _tile_loadd(6, b, kPanelStride);
    _tile_dpbf16ps(0, 4, 6);
    for (int64_t line = 0; line < kPanelStep / kLine / 2; ++line) {
      _mm_prefetch(next_b + line * 64, _MM_HINT_T0);
    }
    _tile_loadd(7, b + 16, kPanelStride);
    _tile_dpbf16ps(1, 4, 7);
    for (int64_t line = kPanelStep / kLine / 2; line < kPanelStep / kLine; ++line) {
      _mm_prefetch(next_b + line * 64, _MM_HINT_T0);
    }
    _tile_loadd(5, strip + strip_offset(16, p), kStripStride);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  constexpr int64_t kTotalStride = kTileCols * 4;
  _tile_stored(0, &total[0][0], kTotalStride);
  _tile_stored(1, &total[0][16], kTotalStride);
  _tile_stored(2, &total[16][0], kTotalStride);
  _tile_stored(3, &total[16][16], kTotalStride);
}

}  // namespace mantissa::core::amx
