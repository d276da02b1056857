// The checksum the cross-rank consistency check compares, one definition for host and device:
// the CPU backend's loop and the CUDA kernel add the same terms.
//
//   checksum(bytes) = sum mod 2^64 of  checksum_word(w_i, i)       over the whole 8-byte words
//                                    + checksum_tail_byte(b_j, j)  over the bytes past them
//
// A sum parallelises in any order and gives the same bits on every device and thread count
// (integer addition is exact). Each term mixes a word with its position, so a changed, swapped
// or moved word changes the sum.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/dtype/dtype.h"

namespace mantissa::core {

MANTISSA_HD uint64_t checksum_word(uint64_t word, uint64_t index) {
  return mix64(word ^ mix64(index + 0x9e3779b97f4a7c15ULL));
}

MANTISSA_HD uint64_t checksum_tail_byte(uint8_t byte, uint64_t position) {
  return mix64(byte + (position << 8));
}

// The checksum of host memory (OpenMP threads); the CPU backend's checksum op and host-side
// callers (the FP8 scales of the consistency check) use it.
uint64_t checksum_bytes(const void* data, size_t nbytes);

}  // namespace mantissa::core
