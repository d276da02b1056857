// safetensors files: the writer (mantissa export) and a validating reader (model.init_from,
// tests).
//
// The format (huggingface/safetensors): an 8-byte little-endian unsigned header length N, then
// N bytes of JSON — one object mapping each tensor name to {"dtype", "shape", "data_offsets":
// [begin, end)}, offsets relative to the byte after the header, plus an optional
// "__metadata__" object of string values — then the raw little-endian tensor bytes, which the
// tensors' ranges cover exactly, without gaps or overlaps. We pad the header with spaces to a
// multiple of 8 bytes, as the reference writer does, so every tensor starts aligned.
//
// The writer (safetensors.cpp) and the reader (safetensors_read.cpp) are separate so that the
// fuzzer links the reader without the parameter store.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/durable_file.h"
#include "core/ops/backend.h"
#include "train/parameters.h"

namespace mantissa::checkpoint {

// ---- writing --------------------------------------------------------------------------------

// One FP32 tensor of a file being written: `fill` is called once, while the file is written
// (tensors in order), to put its shape's element count of values, row-major, at `out`. So a
// file is produced tensor by tensor, never as a second copy of all the weights.
struct SafetensorsOutput {
  std::string name;
  std::vector<int64_t> shape;
  std::function<void(float* out)> fill;
};

// Writes `tensors` (F32, in this order) to `path` through a temporary file beside it, fsynced
// and renamed into place, so that `path` never exists half-written. `metadata` goes into
// "__metadata__". Throws core::Error naming the path: a name given twice or named __metadata__,
// an I/O error; core::Interrupted when a signal comes under a core::InterruptWatch (checked per
// tensor). The temporary file goes with either. `at_path` says what becomes of a file at `path`
// (core::write_file_atomically).
void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       core::AtPath at_path = core::AtPath::kReplace);

// Writes every parameter's FP32 master (by its name and shape, e.g. GPT-2's "wte" [V, C],
// "h.0.attn.c_attn.weight" [3C, C], stored [out, in]) to `path` with write_safetensors.
// `leading_rows` names parameters of which only the first rows are written, the tensor's
// shape saying so (GPT-2's wte without its vocabulary padding: {"wte", vocab_size}); a count
// outside [1, the parameter's rows] or a name the store does not have is an error. Throws
// core::Error naming the path, or when the store keeps only a range of the masters (load a
// whole checkpoint into an unsharded model instead, as `mantissa export` does).
// (Hugging Face's layouts are launcher/hf_weights.h's business.)
void export_safetensors(const std::string& path, const train::ParameterStore& params,
                        core::Backend& backend,
                        const std::map<std::string, std::string>& metadata = {},
                        const std::map<std::string, int64_t>& leading_rows = {},
                        core::AtPath at_path = core::AtPath::kReplace);

// ---- reading --------------------------------------------------------------------------------
// Every problem is one core::Error line naming the file and what is wrong with it: shorter
// than the header length field, a header length beyond the file (or the reference's 100 MB
// limit), a header that is not a JSON object, an entry without dtype, shape or data_offsets,
// an unknown dtype, a shape that does not match its byte range, data truncated before the
// last tensor ends, ranges that leave bytes to no tensor or share them.

// A tensor as the header describes it: its data is bytes [begin, end) of the data section.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", ... (every dtype of the format is known)
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;

  int64_t numel() const;
};

struct SafetensorsHeader {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsEntry> tensors;  // in the order of their data
  uint64_t data_start = 0;                // file offset of the data section: 8 + N
};

// Bytes per element of a dtype of the format, 0 for a name that is none.
size_t safetensors_dtype_bytes(std::string_view dtype);

// Validates the header of a file of `file_size` bytes whose first bytes are `prefix` (at least
// the length field and as much of the header as the file has); `path` names it in errors.
SafetensorsHeader parse_safetensors_header(std::string_view prefix, uint64_t file_size,
                                           const std::string& path);

// Reads and validates the header only (model.init_from reads the tensors one at a time).
SafetensorsHeader read_safetensors_header(const std::string& path);

// Whether one tensor's bytes (of a file whose header was read by read_safetensors_header) are
// `expected`, read a few MiB at a time: a tied copy as large as the embedding is compared
// without a second copy of it in memory.
bool safetensors_data_equals(const std::string& path, const SafetensorsHeader& header,
                             const SafetensorsEntry& entry, std::span<const char> expected);

// The bytes of one tensor of a file whose header was read by read_safetensors_header.
std::vector<char> read_safetensors_data(const std::string& path, const SafetensorsHeader& header,
                                        const SafetensorsEntry& entry);

struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  std::vector<char> data;
};

struct SafetensorsFile {
  std::map<std::string, std::string> metadata;
  std::vector<SafetensorsTensor> tensors;  // in the order of their data
};

// Reads and validates a whole file.
SafetensorsFile read_safetensors(const std::string& path);

// The same from bytes in memory (`path` only names them in errors).
SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& path);

}  // namespace mantissa::checkpoint
