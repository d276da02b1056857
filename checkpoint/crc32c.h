// CRC32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of iSCSI, ext4 and
// TFRecord: it detects every error burst of up to 32 bits, so any single flipped byte.
//
// Software, table-driven ("slicing by 8": eight 256-entry tables let the loop consume eight
// bytes per iteration with independent lookups), so it gives the same answer on every
// machine without depending on SSE4.2.
#pragma once

#include <cstddef>
#include <cstdint>

namespace mantissa::checkpoint {

// The CRC32C of `size` bytes, continuing from `crc` (the CRC of the bytes before them, 0 at
// the start): crc32c(b, n, crc32c(a, m)) is the CRC of a followed by b.
uint32_t crc32c(const void* data, size_t size, uint32_t crc = 0);

}  // namespace mantissa::checkpoint
