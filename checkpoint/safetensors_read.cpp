// The safetensors reader: every malformed file is one core::Error line naming the file, never a
// crash (tests/fuzz/fuzz_safetensors.cpp feeds it arbitrary bytes).
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/json_nesting.h"
#include "core/read_file.h"

namespace mantissa::checkpoint {
namespace {

// The reference implementation refuses larger headers; so do we.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

// A JSON number that must be a non-negative integer (JSON numbers arrive as doubles, exact up
// to 2^53, far beyond any offset of ours).
uint64_t json_integer(const google::protobuf::Value& v, const std::string& what) {
  MANTISSA_REQUIRE(v.kind_case() == google::protobuf::Value::kNumberValue, kConfig,
                   what << " is not a number");
  const double d = v.number_value();
  MANTISSA_REQUIRE(d >= 0 && d <= 9007199254740992.0 && std::floor(d) == d, kConfig,
                   what << " = " << d << " is not a non-negative integer");
  return static_cast<uint64_t>(d);
}

SafetensorsEntry parse_entry(const std::string& name, const google::protobuf::Struct& fields,
                             const std::string& what) {
  const auto& f = fields.fields();
  for (const char* key : {"dtype", "shape", "data_offsets"})
    MANTISSA_REQUIRE(f.contains(key), kConfig, what << " has no \"" << key << "\"");
  SafetensorsEntry t;
  t.name = name;
  MANTISSA_REQUIRE(f.at("dtype").kind_case() == google::protobuf::Value::kStringValue, kConfig,
                   what << ": dtype is not a string");
  t.dtype = f.at("dtype").string_value();
  const size_t element_size = safetensors_dtype_bytes(t.dtype);
  MANTISSA_REQUIRE(element_size > 0, kConfig, what << ": unknown dtype '" << t.dtype << "'");
  MANTISSA_REQUIRE(f.at("shape").kind_case() == google::protobuf::Value::kListValue, kConfig,
                   what << ": shape is not a list");
  uint64_t numel = 1;
  for (const auto& d : f.at("shape").list_value().values()) {
    const uint64_t dim = json_integer(d, what + " shape");
    t.shape.push_back(static_cast<int64_t>(dim));
    MANTISSA_REQUIRE(!__builtin_mul_overflow(numel, dim, &numel), kConfig,
                     what << ": shape overflows");
  }
  const auto& offsets = f.at("data_offsets");
  MANTISSA_REQUIRE(offsets.kind_case() == google::protobuf::Value::kListValue &&
                       offsets.list_value().values_size() == 2,
                   kConfig, what << ": data_offsets is not [begin, end]");
  t.begin = json_integer(offsets.list_value().values(0), what + " data_offsets");
  t.end = json_integer(offsets.list_value().values(1), what + " data_offsets");
  MANTISSA_REQUIRE(
      t.begin <= t.end, kConfig,
      what << ": data_offsets [" << t.begin << ", " << t.end << ") end before they begin");
  MANTISSA_REQUIRE(
      numel <= (t.end - t.begin) / element_size && numel * element_size == t.end - t.begin, kConfig,
      what << ": shape and dtype need " << numel << " x " << element_size
           << " bytes, data_offsets give " << t.end - t.begin);
  return t;
}

}  // namespace

int64_t SafetensorsEntry::numel() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

size_t safetensors_dtype_bytes(std::string_view dtype) {
  static const std::map<std::string_view, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto found = sizes.find(dtype);
  return found == sizes.end() ? 0 : found->second;
}

SafetensorsHeader parse_safetensors_header(std::string_view prefix, uint64_t file_size,
                                           const std::string& path) {
  const std::string where = "safetensors '" + path + "'";
  MANTISSA_REQUIRE(file_size >= 8 && prefix.size() >= 8, kConfig,
                   where << ": " << file_size << " bytes, too short for the header length");
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i)
    header_size |= uint64_t{static_cast<unsigned char>(prefix[i])} << (8 * i);
  MANTISSA_REQUIRE(header_size <= file_size - 8, kConfig,
                   where << ": header length " << header_size << " exceeds the file (" << file_size
                         << " bytes; truncated, or not a safetensors file)");
  MANTISSA_REQUIRE(header_size <= kMaxHeaderBytes, kConfig,
                   where << ": header length " << header_size << " exceeds the 100 MB limit");
  MANTISSA_REQUIRE(
      prefix.size() >= 8 + header_size, kConfig,
      where << ": " << prefix.size() << " bytes given, the header needs " << 8 + header_size);
  const std::string json(prefix.substr(8, header_size));
  MANTISSA_REQUIRE(json.starts_with("{"), kConfig, where << ": the header is not a JSON object");
  const std::optional<size_t> too_deep = core::json_too_deep_at(json);
  MANTISSA_REQUIRE(!too_deep, kConfig,
                   where << ": the header nests deeper than " << core::kMaxJsonNesting
                         << " levels at its byte " << too_deep.value_or(0)
                         << " (a safetensors header nests 3 deep)");
  google::protobuf::Struct header;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &header);
  MANTISSA_REQUIRE(status.ok(), kConfig,
                   where << ": header is not valid JSON: " << status.ToString());

  SafetensorsHeader out;
  out.data_start = 8 + header_size;
  const uint64_t data_size = file_size - out.data_start;
  for (const auto& [name, value] : header.fields()) {
    const std::string what = where + ": '" + name + "'";
    MANTISSA_REQUIRE(value.kind_case() == google::protobuf::Value::kStructValue, kConfig,
                     what << " is not a JSON object");
    if (name == "__metadata__") {
      for (const auto& [key, v] : value.struct_value().fields()) {
        MANTISSA_REQUIRE(v.kind_case() == google::protobuf::Value::kStringValue, kConfig,
                         what << ": value of '" << key << "' is not a string");
        out.metadata[key] = v.string_value();
      }
      continue;
    }
    out.tensors.push_back(parse_entry(name, value.struct_value(), what));
  }
  // In data order; the ranges must lie in the data and tile it: no byte unaccounted for, none
  // shared.
  std::sort(out.tensors.begin(), out.tensors.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return std::pair(a.begin, a.end) < std::pair(b.begin, b.end);
            });
  const auto last = std::max_element(
      out.tensors.begin(), out.tensors.end(),
      [](const SafetensorsEntry& a, const SafetensorsEntry& b) { return a.end < b.end; });
  if (last != out.tensors.end()) {
    MANTISSA_REQUIRE(last->end <= data_size, kConfig,
                     where << ": truncated: tensor '" << last->name << "' ends at data byte "
                           << last->end << ", the file holds " << data_size << " data bytes");
  }
  uint64_t next = 0;
  const SafetensorsEntry* previous = nullptr;
  for (const SafetensorsEntry& t : out.tensors) {
    MANTISSA_REQUIRE(t.begin >= next, kConfig,
                     where << ": tensors '" << previous->name << "' and '" << t.name
                           << "' share data bytes [" << t.begin << ", " << std::min(next, t.end)
                           << ")");
    MANTISSA_REQUIRE(
        t.begin == next, kConfig,
        where << ": data bytes [" << next << ", " << t.begin << ") belong to no tensor");
    next = t.end;
    previous = &t;
  }
  MANTISSA_REQUIRE(
      next == data_size, kConfig,
      where << ": data bytes [" << next << ", " << data_size << ") belong to no tensor");
  return out;
}

SafetensorsHeader read_safetensors_header(const std::string& path) {
  std::ifstream in = core::open_for_reading(path, "safetensors");
  in.seekg(0, std::ios::end);
  const auto file_size = static_cast<uint64_t>(in.tellg());
  std::string prefix(std::min<uint64_t>(file_size, 8), '\0');
  in.seekg(0);
  in.read(prefix.data(), static_cast<std::streamsize>(prefix.size()));
  if (prefix.size() == 8) {
    uint64_t header_size = 0;
    for (int i = 0; i < 8; ++i)
      header_size |= uint64_t{static_cast<unsigned char>(prefix[i])} << (8 * i);
    // Only what the file holds of a header within the limit: the parse names the problem.
    if (header_size <= kMaxHeaderBytes && header_size <= file_size - 8) {
      prefix.resize(8 + header_size);
      in.read(prefix.data() + 8, static_cast<std::streamsize>(header_size));
    }
  }
  MANTISSA_REQUIRE(in, kConfig, "safetensors '" << path << "': cannot read the header");
  return parse_safetensors_header(prefix, file_size, path);
}

bool safetensors_data_equals(const std::string& path, const SafetensorsHeader& header,
                             const SafetensorsEntry& entry, std::span<const char> expected) {
  if (entry.end - entry.begin != expected.size()) return false;
  constexpr size_t kChunk = size_t{4} << 20;
  std::vector<char> chunk(std::min(kChunk, expected.size()));
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(header.data_start + entry.begin));
  for (size_t at = 0; at < expected.size(); at += chunk.size()) {
    const size_t n = std::min(chunk.size(), expected.size() - at);
    in.read(chunk.data(), static_cast<std::streamsize>(n));
    MANTISSA_REQUIRE(in, kFailure,
                     "safetensors '" << path << "': cannot read tensor '" << entry.name
                                     << "' (the file changed since its header was read?)");
    if (!std::equal(chunk.begin(), chunk.begin() + static_cast<std::ptrdiff_t>(n),
                    expected.begin() + static_cast<std::ptrdiff_t>(at))) {
      return false;
    }
  }
  return true;
}

std::vector<char> read_safetensors_data(const std::string& path, const SafetensorsHeader& header,
                                        const SafetensorsEntry& entry) {
  std::vector<char> data(entry.end - entry.begin);
  std::ifstream in(path, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(header.data_start + entry.begin));
  in.read(data.data(), static_cast<std::streamsize>(data.size()));
  MANTISSA_REQUIRE(in, kFailure,
                   "safetensors '" << path << "': cannot read tensor '" << entry.name
                                   << "' (the file changed since its header was read?)");
  return data;
}

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& path) {
  const SafetensorsHeader header = parse_safetensors_header(bytes, bytes.size(), path);
  SafetensorsFile file;
  file.metadata = header.metadata;
  for (const SafetensorsEntry& t : header.tensors) {
    const auto begin = bytes.begin() + static_cast<int64_t>(header.data_start + t.begin);
    file.tensors.push_back(
        {t.name, t.dtype, t.shape,
         std::vector<char>(begin, begin + static_cast<int64_t>(t.end - t.begin))});
  }
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  return parse_safetensors(core::read_whole_file(path, "safetensors"), path);
}

}  // namespace mantissa::checkpoint
