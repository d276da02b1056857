// Throughput of the checkpoint checksum (checkpoint/crc32c.h) next to memcpy.
//
// Every checkpoint save computes the CRC32C of its whole payload (the FP32 masters and the
// AdamW moments: 12 bytes per parameter under ZeRO-0 on rank 0), and every resume computes
// it again. One thread, as the checkpointer runs it. The anchor is a memcpy of the same
// buffer (which reads and writes it, where the checksum only reads); the three are timed in
// alternation and the medians compared, so load from other processes shifts them alike.
// Figures only: nothing here passes or fails.
//
// Usage: bench_checksum [MiB >= 1]   (default 256)
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "bench/bench_main.h"
#include "bench/bench_timing.h"
#include "checkpoint/crc32c.h"

namespace {

using mantissa::bench::median;
using mantissa::bench::seconds_of;

constexpr int kRepeats = 7;

int benchmark_main(int argc, char** argv) {
  const mantissa::bench::Arguments args(argc, argv, "bench_checksum [MiB >= 1]");
  args.expect_at_most(1);
  const long mib = args.whole<long>(1, 256, 1);
  const size_t bytes = static_cast<size_t>(mib) << 20;
  std::vector<unsigned char> data(bytes), copy(bytes);
  std::mt19937_64 rng(1);
  for (size_t i = 0; i < bytes; i += 8) {
    const uint64_t word = rng();
    std::memcpy(data.data() + i, &word, std::min<size_t>(8, bytes - i));
  }

  std::vector<double> copy_s, crc_s, table_s;
  uint32_t crc = 0, table = 0;
  for (int r = 0; r < kRepeats; ++r) {
    copy_s.push_back(seconds_of([&] { std::memcpy(copy.data(), data.data(), bytes); }));
    crc_s.push_back(seconds_of([&] { crc = mantissa::checkpoint::crc32c(data.data(), bytes); }));
    table_s.push_back(
        seconds_of([&] { table = mantissa::checkpoint::crc32c_table(data.data(), bytes); }));
  }
  if (crc != table) {
    std::fprintf(stderr, "bench_checksum: the two CRCs differ (0x%08x, 0x%08x)\n", crc, table);
    return 1;
  }
  // The copy is read, so that the anchor's memcpy cannot be optimised away.
  if (copy[bytes / 2] != data[bytes / 2]) {
    std::fprintf(stderr, "bench_checksum: memcpy left a different buffer\n");
    return 1;
  }
  const double gb = static_cast<double>(bytes) / 1e9;
  const double anchor = gb / median(copy_s);
  std::printf("checksum of %ld MiB, one thread (GB/s read; ratio to memcpy of the same buffer)\n",
              mib);
  std::printf("  %-34s %8.2f GB/s  1.00x\n", "memcpy (anchor)", anchor);
  std::printf("  %-34s %8.2f GB/s  %.2fx\n", "crc32c (crc32 instruction)", gb / median(crc_s),
              gb / median(crc_s) / anchor);
  std::printf("  %-34s %8.2f GB/s  %.2fx\n", "crc32c_table (slicing by 8)", gb / median(table_s),
              gb / median(table_s) / anchor);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return mantissa::bench::exit_status_of("bench_checksum",
                                         [&] { return benchmark_main(argc, argv); });
}
