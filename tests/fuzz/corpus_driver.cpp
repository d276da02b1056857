// Runs a fuzz target's LLVMFuzzerTestOneInput on every file of the given directories, without
// libFuzzer: the fixed corpus of past inputs becomes a regular test of the main build. A
// failure is whatever the harness does on a bad input (a trap, an escaping exception).
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

int main(int argc, char** argv) {
  std::vector<std::filesystem::path> files;
  for (int i = 1; i < argc; ++i)
    for (const auto& entry : std::filesystem::recursive_directory_iterator(argv[i]))
      if (entry.is_regular_file()) files.push_back(entry.path());
  if (files.empty()) {
    std::fprintf(stderr, "corpus_driver: no input files under the given directories\n");
    return 1;
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    std::ifstream in(file, std::ios::binary);
    const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    std::fprintf(stderr, "corpus_driver: %s (%zu bytes)\n", file.c_str(), bytes.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  }
  std::printf("corpus_driver: %zu inputs ran without a failure\n", files.size());
  return 0;
}
