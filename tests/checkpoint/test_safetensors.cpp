// safetensors export: a GPT-2's FP32 masters written by export_safetensors are read back by
// our reader (bit-identical) and by an independent Python reader (the safetensors library when
// installed, else the format's definition with the standard library), wte without the
// model's vocabulary padding; malformed files are rejected with a message naming the problem.
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
  if (std::system("python3 -c '' 2>/dev/null") != 0) GTEST_SKIP() << "no python3";
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

  auto error = [](const std::string& bytes) -> std::string {
    try {
      checkpoint::parse_safetensors(bytes, "f");
    } catch (const core::Error& e) {
      return e.what();
    }
    return "";
  };
  auto expect_error = [&](const std::string& bytes, const std::string& part) {
    const std::string e = error(bytes);
    EXPECT_NE(e.find(part), std::string::npos) << "expected '" << part << "', got '" << e << "'";
  };
  expect_error("abc", "too short");
  std::string huge = file("{}", 0);
  huge[7] = 1;  // header length 2^56
  expect_error(huge, "exceeds the file");
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
  expect_error(file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,80]}})", 8),
               "outside the 8 data bytes");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                    8),
               "are shared");
  expect_error(file(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "has no \"data_offsets\"");
}
