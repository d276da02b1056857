// Fuzz target: the config pipeline of `mantissa train` — protobuf text-format parsing of a
// TrainConfig, --set overrides, defaults and validation (launcher/config/config.h).
//
// Input: config text; lines that start with "--set " are taken out of the text and applied
// as overrides after parsing, so one input exercises both syntaxes. Every rejection must be a
// core::ConfigError (or core::Error) with a message; anything else — a crash, a sanitizer report,
// any other exception escaping — is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"
#include "launcher/config/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::string text;
  std::vector<std::string> overrides;
  size_t start = 0;
  while (start < input.size()) {
    size_t end = input.find('\n', start);
    if (end == std::string::npos) end = input.size();
    const std::string line = input.substr(start, end - start);
    if (line.starts_with("--set ")) {
      overrides.push_back(line.substr(6));
    } else {
      text += line;
      text += '\n';
    }
    start = end + 1;
  }
  try {
    mantissa::TrainConfig config = mantissa::launcher::parse_config_text(text, "fuzz.pbtxt");
    for (const std::string& assignment : overrides)
      mantissa::launcher::apply_override(config, assignment);
    mantissa::launcher::apply_defaults(config, "fuzz.pbtxt");
    mantissa::launcher::validate(config);
    // A valid config must print and parse back to the same config.
    const std::string printed = mantissa::launcher::to_text(config);
    const mantissa::TrainConfig again = mantissa::launcher::parse_config_text(printed, "printed");
    if (again.SerializeAsString() != config.SerializeAsString()) __builtin_trap();
  } catch (const mantissa::core::ConfigError&) {
  } catch (const mantissa::core::Error&) {
  }
  return 0;
}
