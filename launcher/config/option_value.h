// The value of one option of a command line, written "--name=value" or "--name value", as
// every mantissa command (and mantissa-tokenize) reads its options.
#pragma once

#include <charconv>
#include <cmath>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "core/error.h"

namespace mantissa::launcher {

// The value of the option args[i]: what follows its '=', else the next argument (i then
// moves past it), unless that is another option ("--..."): `--run --max-new-tokens 3` is a
// forgotten value, not a run directory named "--max-new-tokens". An option without a value
// throws core::ConfigError "<name> needs a value" followed by `usage` (e.g. " (see mantissa
// train --help)"); a value that starts with "--" is written "<name>=<value>".
inline std::string option_value(const std::vector<std::string>& args, size_t& i,
                                const std::string& usage) {
  const std::string& arg = args[i];
  const size_t eq = arg.find('=');
  if (eq != std::string::npos) return arg.substr(eq + 1);
  if (i + 1 < args.size() && !args[i + 1].starts_with("--")) return args[++i];
  const std::string found = i + 1 < args.size()
                                ? ", but the next argument is the option '" + args[i + 1] +
                                      "' (write " + arg + "=VALUE for a value starting with --)"
                                : "";
  throw core::ConfigError(arg + " needs a value" + found + usage);
}

// Refuses an option given a second time (core::ConfigError "<name> given twice" followed by
// `usage`): its second value would silently replace the first. `given` holds those seen so far.
inline void require_given_once(std::set<std::string>& given, const std::string& name,
                               const std::string& usage) {
  if (!given.insert(name).second) throw core::ConfigError(name + " given twice" + usage);
}

// Whether `args` ask for the help: "-h" or "--help" where an option stands (even beside a bad
// one), not as an option's value (`--prompt -h` continues the text "-h"), for commands whose
// every option takes one value.
inline bool help_asked(const std::vector<std::string>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "-h" || args[i] == "--help") return true;
    // Its value, as option_value takes it.
    if (args[i].starts_with("--") && args[i].find('=') == std::string::npos &&
        i + 1 < args.size() && !args[i + 1].starts_with("--")) {
      ++i;
    }
  }
  return false;
}

// An option's value as a whole number of type T: the decimal digits alone (an optional '-' for
// signed types), nothing before or after; nullopt otherwise (the command words its refusal).
template <class T>
std::optional<T> whole_number(std::string_view text) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size()) return std::nullopt;
  return value;
}

// An option's value as a finite number ("0.5", "1e-3", "-2"), nothing before or after it;
// nullopt otherwise.
inline std::optional<double> finite_number(std::string_view text) {
  double value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || !std::isfinite(value)) {
    return std::nullopt;
  }
  return value;
}

}  // namespace mantissa::launcher
