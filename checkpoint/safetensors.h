// safetensors export (and a reader, to check what we write).
//
// The format (huggingface/safetensors): an 8-byte little-endian unsigned header length N, then
// N bytes of JSON — one object mapping each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end)}, offsets relative to the byte after the header, plus an optional
// "__metadata__" object of string values — then the raw little-endian tensor bytes, which the
// tensors' ranges cover exactly, without gaps or overlaps. We pad the header with spaces to a
// multiple of 8 bytes, as the reference writer does, so every tensor starts aligned.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/ops/backend.h"
#include "train/parameters.h"

namespace mantissa::checkpoint {

// Writes every parameter's FP32 master (by its GPT-2 name and shape, e.g. "wte" [V, C],
// "h.0.attn.c_attn.weight" [3C, C], stored [out, in]) to `path`, through a temporary file
// renamed into place. `metadata` goes into "__metadata__". `leading_rows` names parameters of
// which only the first rows are written, the tensor's shape saying so (GPT-2's wte without its
// vocabulary padding: {"wte", vocab_size}); a count outside [1, the parameter's rows] or a
// name the store does not have is an error. Throws core::Error naming the path, or when the
// store keeps only a range of the masters (load a whole checkpoint into an unsharded model
// instead, as `mantissa export` does).
// (Hugging Face's GPT-2 stores its Conv1D weights transposed, [in, out]: a converter to that
// layout transposes the four matrices of each block.)
void export_safetensors(const std::string& path, const train::ParameterStore& params,
                        core::Backend& backend,
                        const std::map<std::string, std::string>& metadata = {},
                        const std::map<std::string, int64_t>& leading_rows = {});

struct SafetensorsTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::vector<char> data;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensor> tensors;  // in the order of their data
};

// Reads and validates a whole file (header JSON, dtypes, shapes against byte ranges, ranges
// tiling the data); throws core::Error naming the path and the problem.
SafetensorsFile read_safetensors(const std::string& path);

// The same from bytes in memory (`path` only names them in errors).
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& path);

}  // namespace mantissa::checkpoint
