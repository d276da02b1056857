// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of iSCSI, ext4 and
// TFRecord: it detects every error burst of up to 32 bits, so any single flipped byte.
//
// Where the CPU has SSE4.2 (every x86-64-v2 CPU and newer) its crc32 instruction computes it,
// eight bytes per instruction; elsewhere a table-driven loop ("slicing by 8": eight 256-entry
// tables let it consume eight bytes per iteration with independent lookups) does. Both give
// the same answer, the CRC being defined by the polynomial alone.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mantissa::checkpoint {

// The CRC32C of `size` bytes, continuing from `crc` (the CRC of the bytes before them, 0 at
// the start): crc32c(b, n, crc32c(a, m)) is the CRC of a followed by b.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

// The table-driven loop alone, whatever the CPU: the reference the tests compare the
// instruction with.
uint32_t crc32c_table(const void* data, size_t size, uint32_t crc = 0);

}  // namespace mantissa::checkpoint
