#include "launcher/cli.h"

namespace mantissa::launcher {

TrainArgs parse_train_args(const std::string& command, const std::vector<std::string>& args) {
  TrainArgs out;
  const std::string usage = " (see mantissa " + command + " --help)";
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "-h" || arg == "--help") {
      out.help = true;
      continue;
    }
    // "--name=value" or "--name value".
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(0, eq);
    const bool known = name == "--config" || name == "--set" ||
                       (name == "--progress" && command == "train") ||
                       (name == "--out" && command == "export");
    if (!known) {
      throw core::ConfigError("unknown argument '" + arg + "'" + usage);
    }
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw core::ConfigError(name + " needs a value" + usage);
    }
    if (name == "--config") {
      if (!out.config_path.empty()) {
        throw core::ConfigError("--config given twice" + usage);
      }
      out.config_path = value;
    } else if (name == "--set") {
      out.sets.push_back(value);
    } else if (name == "--out") {
      out.out = value;
    } else if (value == "auto" || value == "live" || value == "lines") {
      out.progress = value == "live"    ? metrics::ProgressMode::kLive
                     : value == "lines" ? metrics::ProgressMode::kLines
                                        : metrics::ProgressMode::kAuto;
    } else {
      throw core::ConfigError("--progress takes auto, live or lines, got '" + value + "'" + usage);
    }
  }
  if (!out.help && out.config_path.empty()) {
    throw core::ConfigError("--config FILE.pbtxt is required" + usage);
  }
  if (!out.help && command == "export" && out.out.empty()) {
    throw core::ConfigError("--out FILE.safetensors is required" + usage);
  }
  return out;
}

TrainConfig effective_config(const TrainArgs& args) {
  TrainConfig config = load_config_file(args.config_path);
  for (const std::string& set : args.sets) apply_override(config, set);
  apply_defaults(config, args.config_path);
  validate(config);
  return config;
}

}  // namespace mantissa::launcher
