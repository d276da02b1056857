// Fuzz target: the checkpoint manifest loader (checkpoint/checkpoint_manifest.h, and the load
// path of checkpoint/checkpoint.h behind it).
//
// Each input is tried twice: as the bytes of manifest.pb, where nearly every input fails the
// CRC32C trailer, and sealed with a correct trailer, which lets the fuzzer reach the protobuf
// parser and every validation of a TrainState behind the checksum. A sealed input that
// validates is then loaded for real from a checkpoint directory with a fixed 4 KiB payload
// file, asking for every buffer it declares (up to a size bound), so the size checks, the
// CRC checks of the entries and the copies into the slices run on fuzzer-chosen indices.
// Rejections must be core::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/checkpoint_manifest.h"
#include "core/error.h"
#include "tests/fuzz/process_scratch.h"

namespace {

namespace fs = std::filesystem;
using namespace mantissa;

// A checkpoint directory of this process: <dir>/step_00000001/{manifest.pb, rank_00000.bin}.
const std::string& checkpoint_dir() {
  static const fuzz::ProcessScratch scratch("mantissa_fuzz_manifest");
  static const std::string dir = [] {
    const std::string& d = scratch.path();
    fs::create_directories(d + "/step_00000001");
    std::ofstream payload(d + "/step_00000001/rank_00000.bin", std::ios::binary);
    for (int i = 0; i < 4096; ++i) payload.put(static_cast<char>(i * 7));
    return d;
  }();
  return dir;
}

void load(const std::string& sealed, const checkpoint::Manifest& manifest) {
  int64_t total = 0;
  for (const auto& entries : manifest.buffers) total += entries[0].shape(0);
  if (total > (int64_t{1} << 16)) return;  // slices are allocated: keep them small

  {
    std::ofstream out(checkpoint_dir() + "/step_00000001/manifest.pb",
                      std::ios::binary | std::ios::trunc);
    out.write(sealed.data(), static_cast<std::streamsize>(sealed.size()));
  }
  std::vector<std::vector<char>> storage;
  std::vector<checkpoint::BufferSlice> slices;
  for (const auto& entries : manifest.buffers) {
    const core::DType dtype = checkpoint::from_proto_dtype(entries[0].dtype(), "fuzz");
    const int64_t n = entries[0].shape(0);
    storage.emplace_back(static_cast<size_t>(n) * core::dtype_size(dtype) + 1);
    slices.push_back({entries[0].name(), n, 0,
                      core::Tensor::wrap(storage.back().data(), core::Shape{n}, dtype)});
  }
  checkpoint::Checkpointer checkpointer({.dir = checkpoint_dir()}, {});
  checkpointer.load_latest(manifest.state.parameters, slices);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  try {
    checkpoint::decode_manifest(bytes, "fuzz/manifest.pb");
  } catch (const core::Error&) {
  }
  // The input as a TrainState, sealed with a correct trailer (re-serialized, since a body may
  // not hold the trailer's field itself).
  mantissa::TrainState parsed;
  if (!parsed.ParseFromString(bytes)) return 0;
  parsed.clear_manifest_crc32c();
  const std::string sealed = checkpoint::seal_message(parsed);
  try {
    const checkpoint::Manifest manifest = checkpoint::decode_manifest(sealed, "fuzz/manifest.pb");
    load(sealed, manifest);
  } catch (const core::Error&) {
  }
  return 0;
}
