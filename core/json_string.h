// A string as a JSON string literal, written once for every JSON file mantissa writes
// (safetensors headers, step logs, Hugging Face configs).
#pragma once

#include <cstdio>
#include <string>
#include <string_view>

namespace mantissa::core {

// `s` in double quotes with `"` and `\` escaped and control characters as \u00XX (RFC 8259
// requires exactly these; other bytes, UTF-8 included, pass through).
inline std::string json_quoted(std::string_view s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace mantissa::core
