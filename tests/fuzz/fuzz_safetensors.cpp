// Fuzz target: the safetensors reader (checkpoint/safetensors.h), which model.init_from runs on
// weight files from anywhere.
//
// Each input is a file, read twice: from memory (parse_safetensors) and from disk, header first
// and then every tensor on its own (read_safetensors_header, read_safetensors_data: the path
// model.init_from takes). Both must accept or refuse it alike, and an accepted file must hold
// what the header promises: tensors in data order tiling the data, each with its shape's bytes,
// the same bytes both ways. Rejections must be core::Error; anything else is a bug.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "tests/fuzz/process_scratch.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mantissa;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  static const fuzz::ProcessScratch scratch("mantissa_fuzz_safetensors", ".safetensors");
  const std::string& path = scratch.path();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  bool parsed = false, read = false;
  checkpoint::SafetensorsFile file;
  try {
    file = checkpoint::parse_safetensors(bytes, "fuzz.safetensors");
    parsed = true;
  } catch (const core::Error&) {
  }
  try {
    const checkpoint::SafetensorsHeader header = checkpoint::read_safetensors_header(path);
    read = true;
    if (!parsed || header.tensors.size() != file.tensors.size()) std::abort();
    uint64_t next = 0;
    for (size_t i = 0; i < header.tensors.size(); ++i) {
      const checkpoint::SafetensorsEntry& e = header.tensors[i];
      if (e.begin != next || e.name != file.tensors[i].name) std::abort();
      const uint64_t expected =
          static_cast<uint64_t>(e.numel()) * checkpoint::safetensors_dtype_bytes(e.dtype);
      if (e.end - e.begin != expected) std::abort();
      if (checkpoint::read_safetensors_data(path, header, e) != file.tensors[i].data) std::abort();
      next = e.end;
    }
    if (header.data_start + next != size) std::abort();
  } catch (const core::Error&) {
  }
  if (parsed != read) std::abort();
  return 0;
}
