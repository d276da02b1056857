// The safetensors writer (the reader is safetensors_read.cpp).
#include "checkpoint/safetensors.h"

#include <algorithm>
#include <set>

#include "core/durable_file.h"
#include "core/error.h"
#include "core/interrupt.h"
#include "core/json_string.h"

namespace mantissa::checkpoint {
namespace {

int64_t numel_of(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

// The JSON header, padded with spaces to a multiple of 8 bytes.
std::string header_json(const std::vector<SafetensorsOutput>& tensors,
                        const std::map<std::string, std::string>& metadata) {
  // Built with appends only: GCC 12 misreports `const char* + std::string` (-Wrestrict).
  std::string header = "{";
  if (!metadata.empty()) {
    header += "\"__metadata__\":{";
    for (const auto& [key, value] : metadata) {
      if (header.back() != '{') header += ',';
      header += core::json_quoted(key);
      header += ':';
      header += core::json_quoted(value);
    }
    header += '}';
  }
  uint64_t offset = 0;
  for (const SafetensorsOutput& t : tensors) {
    const uint64_t end = offset + static_cast<uint64_t>(numel_of(t.shape)) * 4;
    if (header.size() > 1) header += ',';
    header += core::json_quoted(t.name);
    header += ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t i = 0; i < t.shape.size(); ++i) {
      if (i) header += ',';
      header += std::to_string(t.shape[i]);
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
  return header;
}

}  // namespace

void write_safetensors(const std::string& path, const std::vector<SafetensorsOutput>& tensors,
                       const std::map<std::string, std::string>& metadata, core::AtPath at_path) {
  std::set<std::string> names;
  for (const SafetensorsOutput& t : tensors) {
    MANTISSA_CHECK(t.name != "__metadata__",
                   "safetensors: cannot write '" << path << "': a tensor named __metadata__");
    MANTISSA_CHECK(names.insert(t.name).second,
                   "safetensors: cannot write '" << path << "': tensor " << t.name << " twice");
    for (const int64_t d : t.shape)
      MANTISSA_CHECK(d >= 0, "safetensors: cannot write '" << path << "': tensor " << t.name
                                                           << " has a negative dimension");
  }
  const std::string header = header_json(tensors, metadata);

  // `path` is whole or absent; a write that fails part way leaves no temporary file behind.
  core::write_file_atomically(
      path,
      [&](core::DurableFile& out) {
        const uint64_t n = header.size();
        unsigned char length[8];
        for (int i = 0; i < 8; ++i) length[i] = static_cast<unsigned char>(n >> (8 * i));
        out.write(length, 8);
        out.write(header.data(), header.size());
        std::vector<float> values;
        for (const SafetensorsOutput& t : tensors) {
          core::throw_if_interrupted();  // a model's weights take minutes to write
          values.assign(static_cast<size_t>(numel_of(t.shape)), 0.0f);
          t.fill(values.data());
          out.write(values.data(), values.size() * sizeof(float));
        }
      },
      at_path);
}

void export_safetensors(const std::string& path, const train::ParameterStore& params,
                        core::Backend& backend, const std::map<std::string, std::string>& metadata,
                        const std::map<std::string, int64_t>& leading_rows, core::AtPath at_path) {
  params.require_all_masters("safetensors: cannot write '" + path + "'");
  for (const auto& [name, rows] : leading_rows) {
    const bool known = std::any_of(params.all().begin(), params.all().end(),
                                   [&](const train::Parameter& p) { return p.spec.name == name; });
    MANTISSA_CHECK(known, "safetensors: cannot write '" << path << "': leading rows of " << name
                                                        << " asked for, a parameter the model "
                                                           "does not have");
  }
  backend.synchronize();
  std::vector<SafetensorsOutput> outputs;
  for (const train::Parameter& p : params.all()) {
    // What is written of each parameter: its shape, with fewer rows where leading_rows says so.
    std::vector<int64_t> dims = p.spec.shape.dims();
    const auto found = leading_rows.find(p.spec.name);
    if (found != leading_rows.end()) {
      MANTISSA_CHECK(found->second >= 1 && found->second <= dims[0],
                     "safetensors: cannot write '" << path << "': " << found->second
                                                   << " leading rows of " << p.spec.name << " "
                                                   << p.spec.shape.str() << " asked for");
      dims[0] = found->second;
    }
    const core::Shape shape(dims);
    // The leading rows are the first elements of the row-major master.
    outputs.push_back({p.spec.name, dims, [&p, &backend, shape](float* out) {
                         core::Tensor host = core::Tensor::wrap(out, shape, core::DType::kF32);
                         backend.copy(p.master.view(0, shape), host);
                         backend.synchronize();
                       }});
  }
  write_safetensors(path, outputs, metadata, at_path);
}

}  // namespace mantissa::checkpoint
