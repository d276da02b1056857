// The value of one option of a command line, written "--name=value" or "--name value", as
// every mantissa command (and mantissa-tokenize) reads its options.
#pragma once

#include <string>
#include <vector>

#include "core/error.h"

namespace mantissa::launcher {

// The value of the option args[i]: what follows its '=', else the next argument (i then
// moves past it). An option with neither throws core::ConfigError "<name> needs a value"
// followed by `usage` (e.g. " (see mantissa train --help)").
inline std::string option_value(const std::vector<std::string>& args, size_t& i,
                                const std::string& usage) {
  const std::string& arg = args[i];
  const size_t eq = arg.find('=');
  if (eq != std::string::npos) return arg.substr(eq + 1);
  if (i + 1 < args.size()) return args[++i];
  throw core::ConfigError(arg + " needs a value" + usage);
}

}  // namespace mantissa::launcher
