#include "checkpoint/safetensors.h"

#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace mantissa::checkpoint {
namespace {

// The reference implementation refuses larger headers; so do we.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

size_t dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1},
      {"I16", 2},  {"U16", 2}, {"F16", 2}, {"BF16", 2},    {"I32", 4},
      {"U32", 4},  {"F32", 4}, {"I64", 8}, {"U64", 8},     {"F64", 8}};
  const auto found = sizes.find(dtype);
  return found == sizes.end() ? 0 : found->second;
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", c);
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

// A JSON number that must be a non-negative integer (JSON numbers arrive as doubles, exact up
// to 2^53, far beyond any offset of ours).
int64_t json_integer(const google::protobuf::Value& v, const std::string& what) {
  MANTISSA_CHECK(v.kind_case() == google::protobuf::Value::kNumberValue,
                 what << " is not a number");
  const double d = v.number_value();
  MANTISSA_CHECK(d >= 0 && d <= 9007199254740992.0 && std::floor(d) == d,
                 what << " = " << d << " is not a non-negative integer");
  return static_cast<int64_t>(d);
}

}  // namespace

void export_safetensors(const std::string& path, const train::ParameterStore& params,
                        core::Backend& backend, const std::map<std::string, std::string>& metadata,
                        const std::map<std::string, int64_t>& leading_rows) {
  params.require_all_masters("safetensors: cannot write '" + path + "'");
  // What is written of each parameter: its shape, with fewer rows where leading_rows says so.
  std::vector<core::Shape> shapes;
  for (const train::Parameter& p : params.all()) {
    std::vector<int64_t> dims = p.spec.shape.dims();
    const auto found = leading_rows.find(p.spec.name);
    if (found != leading_rows.end()) {
      MANTISSA_CHECK(found->second >= 1 && found->second <= dims[0],
                     "safetensors: cannot write '" << path << "': " << found->second
                                                   << " leading rows of " << p.spec.name << " "
                                                   << p.spec.shape.str() << " asked for");
      dims[0] = found->second;
    }
    shapes.emplace_back(dims);
  }
  for (const auto& [name, rows] : leading_rows) {
    const bool known = std::any_of(params.all().begin(), params.all().end(),
                                   [&](const train::Parameter& p) { return p.spec.name == name; });
    MANTISSA_CHECK(known, "safetensors: cannot write '" << path << "': leading rows of " << name
                                                        << " asked for, a parameter the model "
                                                           "does not have");
  }
  // Built with appends only: GCC 12 misreports `const char* + std::string` (-Wrestrict).
  std::string header = "{";
  auto separate = [&header] {
    if (header.size() > 1) header += ',';
  };
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      if (header.back() != '{') header += ',';
      header += json_string(key);
      header += ':';
      header += json_string(value);
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (size_t k = 0; k < shapes.size(); ++k) {
    const train::Parameter& p = params.all()[k];
    MANTISSA_CHECK(p.spec.name != "__metadata__", "safetensors: a parameter named __metadata__");
    const uint64_t end = offset + static_cast<uint64_t>(shapes[k].numel()) * 4;
    separate();
    header += json_string(p.spec.name);
    header += ":{\"dtype\":\"F32\",\"shape\":[";
    for (int i = 0; i < shapes[k].rank(); ++i) {
      if (i) header += ',';
      header += std::to_string(shapes[k][i]);
    }
    header += "],\"data_offsets\":[";
    header += std::to_string(offset);
    header += ',';
    header += std::to_string(end);
    header += "]}";
    offset = end;
  }
  header += '}';
  header.append((8 - header.size() % 8) % 8, ' ');

  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MANTISSA_CHECK(out, "safetensors: cannot create '" << tmp << "'");
    uint64_t n = header.size();
    unsigned char length[8];
    for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(length), 8);
    out.write(header.data(), static_cast<std::streamsize>(header.size()));
    backend.synchronize();
    for (size_t k = 0; k < shapes.size(); ++k) {
      // The leading rows are the first elements of the row-major master.
      const core::Tensor written = params.all()[k].master.view(0, shapes[k]);
      core::Tensor host = written;
      if (!written.device().is_cpu()) {
        host = core::Tensor::empty(written.shape(), written.dtype(), core::Device::cpu());
        backend.copy(written, host);
        backend.synchronize();
      }
      out.write(static_cast<const char*>(host.data()), static_cast<std::streamsize>(host.nbytes()));
    }
    out.flush();
    MANTISSA_CHECK(out, "safetensors: write to '" << tmp << "' failed");
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  MANTISSA_CHECK(
      !ec, "safetensors: cannot rename '" << tmp << "' to '" << path << "': " << ec.message());
}

SafetensorsFile parse_safetensors(const std::string& bytes, const std::string& path) {
  const std::string where = "safetensors '" + path + "'";
  MANTISSA_CHECK(bytes.size() >= 8,
                 where << ": " << bytes.size() << " bytes, too short for the header length");
  uint64_t header_size = 0;
  for (int i = 0; i < 8; ++i)
    header_size |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  MANTISSA_CHECK(header_size <= kMaxHeaderBytes && header_size <= bytes.size() - 8,
                 where << ": header length " << header_size << " exceeds the file (" << bytes.size()
                       << " bytes) or the 100 MB limit");
  const std::string json = bytes.substr(8, header_size);
  MANTISSA_CHECK(json.starts_with("{"), where << ": the header is not a JSON object");
  google::protobuf::Struct header;
  const auto status = google::protobuf::util::JsonStringToMessage(json, &header);
  MANTISSA_CHECK(status.ok(), where << ": header is not valid JSON: " << status.ToString());

  SafetensorsFile file;
  const uint64_t data_size = bytes.size() - 8 - header_size;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;  // each tensor's [begin, end)
  for (const auto& [name, value] : header.fields()) {
    const std::string what = where + ": '" + name + "'";
    MANTISSA_CHECK(value.kind_case() == google::protobuf::Value::kStructValue,
                   what << " is not a JSON object");
    const auto& fields = value.struct_value().fields();
    if (name == "__metadata__") {
      for (const auto& [key, v] : fields) {
        MANTISSA_CHECK(v.kind_case() == google::protobuf::Value::kStringValue,
                       what << ": value of '" << key << "' is not a string");
        file.metadata[key] = v.string_value();
      }
      continue;
    }
    for (const char* key : {"dtype", "shape", "data_offsets"})
      MANTISSA_CHECK(fields.contains(key), what << " has no \"" << key << "\"");
    SafetensorsTensor t;
    t.name = name;
    t.dtype = fields.at("dtype").string_value();
    const size_t element_size = dtype_bytes(t.dtype);
    MANTISSA_CHECK(element_size > 0, what << ": unknown dtype '" << t.dtype << "'");
    MANTISSA_CHECK(fields.at("shape").kind_case() == google::protobuf::Value::kListValue,
                   what << ": shape is not a list");
    uint64_t numel = 1;
    for (const auto& d : fields.at("shape").list_value().values()) {
      t.shape.push_back(json_integer(d, what + " shape"));
      MANTISSA_CHECK(!__builtin_mul_overflow(numel, static_cast<uint64_t>(t.shape.back()), &numel),
                     what << ": shape overflows");
    }
    const auto& offsets = fields.at("data_offsets");
    MANTISSA_CHECK(offsets.kind_case() == google::protobuf::Value::kListValue &&
                       offsets.list_value().values_size() == 2,
                   what << ": data_offsets is not [begin, end]");
    const uint64_t begin = json_integer(offsets.list_value().values(0), what + " data_offsets");
    const uint64_t end = json_integer(offsets.list_value().values(1), what + " data_offsets");
    MANTISSA_CHECK(begin <= end && end <= data_size, what << ": data_offsets [" << begin << ", "
                                                          << end << ") outside the " << data_size
                                                          << " data bytes");
    MANTISSA_CHECK(numel <= (end - begin) / element_size && numel * element_size == end - begin,
                   what << ": shape and dtype need " << numel << " x " << element_size
                        << " bytes, data_offsets give " << end - begin);
    t.data.assign(bytes.begin() + static_cast<int64_t>(8 + header_size + begin),
                  bytes.begin() + static_cast<int64_t>(8 + header_size + end));
    ranges.emplace_back(begin, end);
    file.tensors.push_back(std::move(t));
  }
  // In data order, and the ranges must tile the data: no byte unaccounted for, none shared.
  std::vector<size_t> order(file.tensors.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ranges[a] < ranges[b]; });
  uint64_t next = 0;
  std::vector<SafetensorsTensor> sorted;
  for (size_t i : order) {
    MANTISSA_CHECK(ranges[i].first == next,
                   where << ": data bytes [" << next << ", " << ranges[i].first << ") "
                         << (ranges[i].first > next ? "belong to no tensor" : "are shared"));
    next = ranges[i].second;
    sorted.push_back(std::move(file.tensors[i]));
  }
  MANTISSA_CHECK(next == data_size,
                 where << ": data bytes [" << next << ", " << data_size << ") belong to no tensor");
  file.tensors = std::move(sorted);
  return file;
}

SafetensorsFile read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  MANTISSA_CHECK(in, "safetensors: cannot open '" << path << "'");
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  return parse_safetensors(bytes, path);
}

}  // namespace mantissa::checkpoint
