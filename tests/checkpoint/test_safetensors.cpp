// safetensors export: a GPT-2's FP32 masters written by export_safetensors are read back by
// our reader (bit-identical) and by an independent Python reader (the safetensors library when
// installed, else the format's definition with the standard library), wte without the
// model's vocabulary padding; malformed files (truncated, an unknown dtype, a header length
// beyond the file, ranges that do not tile the data, bad JSON, ...) are rejected with one line
// naming the file and the problem, read whole or header first as model.init_from reads them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/safetensors.h"
#include "core/error.h"
#include "core/precision/policy.h"
#include "models/gpt2/gpt2.h"

using namespace mantissa;

namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("mantissa_st_" + std::to_string(::getpid()) + "_" + name))
      .string();
}

// A GPT-2 of 10 tokens, which it pads to 128 rows of wte; the export keeps the 10.
struct Model {
  std::unique_ptr<core::Backend> backend = core::make_cpu_backend();
  models::GPT2 gpt2{{.n_layer = 2, .n_head = 2, .n_embd = 8, .seq_len = 4, .vocab_size = 10},
                    *backend,
                    core::PrecisionPolicy::from_mode(core::PrecisionMode::kFP32),
                    7};
  const std::map<std::string, int64_t> leading_rows = {{"wte", 10}};

  // What the file must hold of parameter i: its shape with wte's rows cut to the vocabulary,
  // and the first elements of its master.
  std::vector<int64_t> exported_shape(size_t i) {
    const train::Parameter& p = gpt2.parameters().all()[i];
    std::vector<int64_t> dims = p.spec.shape.dims();
    if (p.spec.name == "wte") dims[0] = 10;
    return dims;
  }
  int64_t exported_numel(size_t i) {
    int64_t n = 1;
    for (int64_t d : exported_shape(i)) n *= d;
    return n;
  }
};

const std::map<std::string, std::string> kMetadata = {
    {"format", "pt"}, {"mantissa.step", "42"}, {"quote\"and\\backslash", "tab\there"}};

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST(Safetensors, ExportReadsBackBitIdentical) {
  Model m;
  const std::string path = temp_path("model.safetensors");
  checkpoint::export_safetensors(path, m.gpt2.parameters(), *m.backend, kMetadata, m.leading_rows);

  const std::string bytes = read_bytes(path);
  uint64_t header = 0;
  std::memcpy(&header, bytes.data(), 8);
  EXPECT_EQ(header % 8, 0u) << "header padded so the data is 8-byte aligned";

  const checkpoint::SafetensorsFile file = checkpoint::read_safetensors(path);
  EXPECT_EQ(file.metadata, kMetadata);
  const auto& params = m.gpt2.parameters().all();
  ASSERT_EQ(file.tensors.size(), params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const checkpoint::SafetensorsTensor& t = file.tensors[i];
    EXPECT_EQ(t.name, params[i].spec.name);
    EXPECT_EQ(t.dtype, "F32");
    EXPECT_EQ(t.shape, m.exported_shape(i));
    ASSERT_EQ(t.data.size(), static_cast<size_t>(m.exported_numel(i)) * 4);
    EXPECT_EQ(std::memcmp(t.data.data(), params[i].master.data(), t.data.size()), 0) << t.name;
  }
  EXPECT_EQ(file.tensors[0].name, "wte");
  EXPECT_EQ(params[0].spec.shape.dims(), (std::vector<int64_t>{128, 8}));
  EXPECT_EQ(file.tensors[0].shape, (std::vector<int64_t>{10, 8}));
  std::filesystem::remove(path);
}

TEST(Safetensors, PythonReadsTheExport) {
  ASSERT_EQ(std::system("python3 -c ''"), 0) << "python3 is needed (scripts/setup.sh installs it)";
  Model m;
  const std::string path = temp_path("py.safetensors");
  const std::string expected_path = temp_path("expected.json");
  checkpoint::export_safetensors(path, m.gpt2.parameters(), *m.backend, kMetadata, m.leading_rows);

  // What Python must find: the metadata, then every tensor's name, shape and values (%.9g
  // round-trips a float exactly).
  std::FILE* f = std::fopen(expected_path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fprintf(f,
               "{\"metadata\": {\"format\": \"pt\", \"mantissa.step\": \"42\", "
               "\"quote\\\"and\\\\backslash\": \"tab\\there\"}, \"tensors\": [");
  const auto& params = m.gpt2.parameters().all();
  for (size_t i = 0; i < params.size(); ++i) {
    std::fprintf(f, "%s[\"%s\", [", i ? ", " : "", params[i].spec.name.c_str());
    const std::vector<int64_t> dims = m.exported_shape(i);
    for (size_t d = 0; d < dims.size(); ++d)
      std::fprintf(f, "%s%lld", d ? ", " : "", static_cast<long long>(dims[d]));
    std::fprintf(f, "], [");
    const float* v = params[i].master.data_as<float>();
    for (int64_t k = 0; k < m.exported_numel(i); ++k)
      std::fprintf(f, "%s%.9g", k ? ", " : "", v[k]);
    std::fprintf(f, "]]");
  }
  std::fprintf(f, "]}\n");
  std::fclose(f);

  const std::string command =
      std::string("python3 ") + CHECK_SAFETENSORS_PY + " " + path + " " + expected_path;
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
  std::filesystem::remove(path);
  std::filesystem::remove(expected_path);
}

TEST(Safetensors, LeadingRowsMustBeRowsOfAParameter) {
  Model m;
  const std::string path = temp_path("rows.safetensors");
  auto error = [&](const std::map<std::string, int64_t>& leading_rows) -> std::string {
    try {
      checkpoint::export_safetensors(path, m.gpt2.parameters(), *m.backend, {}, leading_rows);
    } catch (const core::Error& e) {
      return e.what();
    }
    return "";
  };
  for (const auto& [rows, part] : {std::pair<int64_t, const char*>{0, "0 leading rows of wte"},
                                   {129, "129 leading rows of wte [128, 8]"}}) {
    const std::string e = error({{"wte", rows}});
    EXPECT_NE(e.find(part), std::string::npos) << e;
  }
  const std::string e = error({{"wtf", 10}});
  EXPECT_NE(e.find("leading rows of wtf asked for, a parameter the model does not have"),
            std::string::npos)
      << e;
  EXPECT_FALSE(std::filesystem::exists(path)) << "nothing written for a refused export";
}

TEST(Safetensors, MalformedFilesAreRejected) {
  // A valid two-tensor file, then variations of it.
  auto file = [](const std::string& json, size_t data_bytes) {
    std::string bytes(8, '\0');
    const uint64_t n = json.size();
    std::memcpy(bytes.data(), &n, 8);
    return bytes + json + std::string(data_bytes, '\x01');
  };
  const std::string a = R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]})";
  const std::string b = R"("b":{"dtype":"BF16","shape":[1,2],"data_offsets":[8,12]})";
  const checkpoint::SafetensorsFile ok =
      checkpoint::parse_safetensors(file("{" + a + "," + b + "}", 12), "ok");
  ASSERT_EQ(ok.tensors.size(), 2u);
  EXPECT_EQ(ok.tensors[1].name, "b");
  EXPECT_EQ(ok.tensors[1].data.size(), 4u);

  // A malformed file is a config error (the file named is the one to fix), without a source
  // location.
  auto error = [](const std::string& bytes) -> std::string {
    try {
      checkpoint::parse_safetensors(bytes, "f");
    } catch (const core::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  auto expect_error = [&](const std::string& bytes, const std::string& part) {
    const std::string e = error(bytes);
    EXPECT_NE(e.find(part), std::string::npos) << "expected '" << part << "', got '" << e << "'";
    EXPECT_EQ(e.find(".cpp:"), std::string::npos) << e;
  };
  expect_error("abc", "safetensors 'f': 3 bytes, too short for the header length");
  std::string huge = file("{}", 0);
  huge[7] = 1;  // header length 2^56
  expect_error(huge, "header length 72057594037927938 exceeds the file (10 bytes");
  expect_error(file("{\"a\":", 0), "not valid JSON");
  expect_error(file("[1]", 0), "not a JSON object");
  expect_error(file("{" + a + "}", 12), "data bytes [8, 12) belong to no tensor");
  expect_error(file("{" + a + "," + b + "}", 16), "belong to no tensor");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8),
               "need 3 x 4 bytes");
  expect_error(file(R"({"a":{"dtype":"F33","shape":[2],"data_offsets":[0,8]}})", 8),
               "unknown dtype 'F33'");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8),
               "not a non-negative integer");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[20],"data_offsets":[0,80]}})", 8),
               "truncated: tensor 'a' ends at data byte 80, the file holds 8 data bytes");
  expect_error(file("{" + a + "," + b + "}", 10), "truncated: tensor 'b' ends at data byte 12");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8),
               "end before they begin");
  expect_error(file(R"({"a":{"dtype":32,"shape":[2],"data_offsets":[0,8]}})", 8),
               "dtype is not a string");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})", 8),
               "data_offsets is not [begin, end]");
  expect_error(file(R"({"__metadata__":{"n":1}})", 0), "value of 'n' is not a string");
  expect_error(file(R"({"a":[1]})", 0), "'a' is not a JSON object");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                    8),
               "safetensors 'f': tensors 'a' and 'b' share data bytes [0, 4)");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "has no \"data_offsets\"");
  // Nested past 64 levels: refused before the JSON parser, whose time grows with the square of
  // the depth. Brackets in strings (an escaped quote among them) are text, not nesting.
  const std::string deep = std::string(100, '[') + std::string(100, ']');
  expect_error(file("{\"a\":" + deep + "}", 0),
               "safetensors 'f': the header nests deeper than 64 levels at its byte 68");
  const std::string text = R"({"__metadata__":{"n":"\")" + deep + R"("}})";
  EXPECT_EQ(checkpoint::parse_safetensors(file(text, 0), "f").tensors.size(), 0u);
}

// The path model.init_from takes: the header alone, then each tensor from the file; a file
// cut short or not a safetensors file at all is one line naming it.
TEST(Safetensors, ReadsHeaderThenTensorsFromDisk) {
  Model m;
  const std::string path = temp_path("disk.safetensors");
  checkpoint::export_safetensors(path, m.gpt2.parameters(), *m.backend, kMetadata, m.leading_rows);
  const checkpoint::SafetensorsHeader header = checkpoint::read_safetensors_header(path);
  const checkpoint::SafetensorsFile whole = checkpoint::read_safetensors(path);
  EXPECT_EQ(header.metadata, kMetadata);
  ASSERT_EQ(header.tensors.size(), whole.tensors.size());
  for (size_t i = 0; i < header.tensors.size(); ++i) {
    EXPECT_EQ(header.tensors[i].name, whole.tensors[i].name);
    EXPECT_EQ(checkpoint::read_safetensors_data(path, header, header.tensors[i]),
              whole.tensors[i].data);
  }

  // A tied copy is compared a few MiB at a time: equal, one byte off at the end of a tensor
  // several chunks long, another size.
  const std::string big = temp_path("big.safetensors");
  {
    const int64_t numel = int64_t{5} << 20;  // 20 MiB of F32
    const std::string json = R"({"w":{"dtype":"F32","shape":[)" + std::to_string(numel) +
                             R"(],"data_offsets":[0,)" + std::to_string(4 * numel) + "]}}";
    std::string bytes(8, '\0');
    const uint64_t n = json.size();
    std::memcpy(bytes.data(), &n, 8);
    std::string data(static_cast<size_t>(4 * numel), '\0');
    for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + i / 4096);
    const std::string whole = bytes + json + data;
    std::ofstream(big, std::ios::binary)
        .write(whole.data(), static_cast<std::streamsize>(whole.size()));
    const checkpoint::SafetensorsHeader h = checkpoint::read_safetensors_header(big);
    EXPECT_TRUE(checkpoint::safetensors_data_equals(big, h, h.tensors[0], data));
    data.back() = static_cast<char>(data.back() ^ 1);
    EXPECT_FALSE(checkpoint::safetensors_data_equals(big, h, h.tensors[0], data));
    data.pop_back();
    EXPECT_FALSE(checkpoint::safetensors_data_equals(big, h, h.tensors[0], data));
    std::filesystem::remove(big);
  }

  auto header_error = [](const std::string& p) -> std::string {
    try {
      checkpoint::read_safetensors_header(p);
    } catch (const core::ConfigError& e) {
      return e.what();
    }
    return "";
  };
  // Cut in the data, in the header, in the length field.
  const std::string bytes = read_bytes(path);
  const std::string cut = temp_path("cut.safetensors");
  for (const auto& [keep, part] :
       {std::pair<size_t, std::string>{bytes.size() - 3, "truncated: tensor 'ln_f.bias' ends at"},
        {100, "exceeds the file (100 bytes; truncated, or not a safetensors file)"},
        {5, "5 bytes, too short for the header length"}}) {
    std::ofstream(cut, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(keep));
    const std::string e = header_error(cut);
    EXPECT_NE(e.find("safetensors '" + cut + "'"), std::string::npos) << e;
    EXPECT_NE(e.find(part), std::string::npos) << e;
  }
  std::ofstream(cut, std::ios::binary) << "# a text file, not weights\n";
  EXPECT_NE(header_error(cut).find("exceeds the file"), std::string::npos);
  EXPECT_NE(header_error(temp_path("missing")).find("cannot open"), std::string::npos);
  EXPECT_NE(header_error(std::filesystem::temp_directory_path().string()).find("a directory"),
            std::string::npos);
  std::filesystem::remove(path);
  std::filesystem::remove(cut);
}

TEST(Safetensors, WriterRefusesDuplicateAndReservedNames) {
  const std::string path = temp_path("names.safetensors");
  auto fill = [](float* out) { out[0] = 1.0f; };
  auto error = [&](const std::vector<checkpoint::SafetensorsOutput>& tensors) -> std::string {
    try {
      checkpoint::write_safetensors(path, tensors);
    } catch (const core::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error({{"x", {1}, fill}, {"x", {1}, fill}}).find("tensor x twice"), std::string::npos);
  EXPECT_NE(error({{"__metadata__", {1}, fill}}).find("a tensor named __metadata__"),
            std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_EQ(error({{"x", {1}, fill}, {"y", {}, fill}}), "");
  const checkpoint::SafetensorsFile file = checkpoint::read_safetensors(path);
  ASSERT_EQ(file.tensors.size(), 2u);
  EXPECT_EQ(file.tensors[1].shape, std::vector<int64_t>{});
  EXPECT_EQ(file.tensors[1].data.size(), 4u);
  std::filesystem::remove(path);
}
