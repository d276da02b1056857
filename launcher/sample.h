// `mantissa sample`: text from a run's checkpoint. Reads the run's effective config, loads the
// FP32 weights of a checkpoint into its GPT-2 or Llama, and continues a prompt with a KV cache
// (models/decoder.h), tokens drawn by models::TokenSampler and turned into text by the
// run's tokenizer (through mantissa-tokenize, launcher/tokenize/tokenize_client.h) or as bytes. One
// process, no MPI.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mantissa::launcher {

struct SampleArgs {
  bool help = false;
  std::string run_dir;
  std::optional<int64_t> step;  // a checkpoint's step; none: the newest intact one
  std::string prompt;
  int64_t max_new_tokens = 256;
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 1;
  std::string device = "AUTO";       // AUTO, CPU or CUDA
  bool stop_at_end_of_text = false;  // --end-of-text stop; mark otherwise
};

// Throws core::ConfigError for a malformed command line or a value out of range, naming it.
SampleArgs parse_sample_args(const std::vector<std::string>& args);

// argv[1] is "sample". Prints the text on stdout; returns the exit code (exit_codes.h), having
// printed the reason for a failure on stderr.
int sample_command(int argc, char** argv);

}  // namespace mantissa::launcher
