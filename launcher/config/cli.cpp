#include "launcher/config/cli.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <set>

#include "launcher/config/option_value.h"
#include "launcher/run_dir.h"

namespace mantissa::launcher {

namespace {

// Whether a refusal ("FIELD = VALUE: rule") names a field of `member` with its value: the
// refused field itself ("model.llama.n_head = 5: ...") or one its rule cites ("... must be >=
// model.llama.seq_len = 256", "[model.llama.seq_len + 1 = 257, ...]"). A path inside a quoted
// value, or a list of fields the rule names without values, is no such citation.
bool cites_a_value_of(const std::string& said, const std::string& member) {
  // What the refusal says outside the values it quotes ("...", with \" inside), which it does
  // not cite.
  std::string refusal = said;
  bool quoted = false;
  for (size_t i = 0; i < refusal.size(); ++i) {
    const char c = refusal[i];
    if (quoted && c == '\\' && i + 1 < refusal.size()) {
      refusal[i] = refusal[i + 1] = '"';
      ++i;
    } else if (c == '"') {
      quoted = !quoted;
    } else if (quoted) {
      refusal[i] = '"';
    }
  }
  const std::string prefix = member + ".";
  for (size_t at = refusal.find(prefix); at != std::string::npos;
       at = refusal.find(prefix, at + 1)) {
    if (at > 0 && refusal[at - 1] != ' ' && refusal[at - 1] != '(' && refusal[at - 1] != '[') {
      continue;
    }
    size_t end = at + prefix.size();
    while (end < refusal.size() && (std::islower(static_cast<unsigned char>(refusal[end])) ||
                                    std::isdigit(static_cast<unsigned char>(refusal[end])) ||
                                    refusal[end] == '_' || refusal[end] == '.')) {
      ++end;
    }
    const bool cited = refusal.compare(end, 3, " = ") == 0 || refusal.compare(end, 3, " + ") == 0;
    if (end > at + prefix.size() && cited) return true;
  }
  return false;
}

}  // namespace

TrainArgs parse_train_args(const std::string& command, const std::vector<std::string>& args) {
  TrainArgs out;
  const std::string usage = " (see mantissa " + command + " --help)";
  std::set<std::string> given;
  out.help = help_asked(args);
  if (out.help) return out;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& arg = args[i];
    const std::string name = arg.substr(0, arg.find('='));
    const bool known =
        name == "--config" || name == "--set" || (name == "--progress" && command == "train") ||
        (name == "--get" && command == "config") ||
        ((name == "--out" || name == "--format" || name == "--run") && command == "export");
    if (!known) {
      throw core::ConfigError("unknown argument '" + arg + "'" + usage);
    }
    const std::string value = option_value(args, i, usage);
    // One value each (--set may repeat; --config and --run say more below).
    if (name != "--set" && name != "--config" && name != "--run") {
      require_given_once(given, name, usage);
    }
    if (name == "--config") {
      if (!out.config_path.empty()) {
        throw core::ConfigError(
            std::string(out.run_dir.empty() ? "--config given twice" : "--config with --run") +
            usage);
      }
      out.config_path = value;
    } else if (name == "--run") {
      // The run's own effective config, with the run directory where it is now: a relative
      // run.dir in it names the directory from where the run was started.
      if (!out.config_path.empty()) {
        throw core::ConfigError(
            std::string(out.run_dir.empty() ? "--run with --config" : "--run given twice") + usage);
      }
      if (value.empty()) throw core::ConfigError("--run needs a run directory" + usage);
      out.run_dir = value;
      out.config_path = run_config_file(value);
      out.sets.insert(out.sets.begin(), "run.dir=" + value);
    } else if (name == "--set") {
      out.sets.push_back(value);
    } else if (name == "--get") {
      if (value.empty()) throw core::ConfigError("--get needs a field's path" + usage);
      out.get = value;
    } else if (name == "--out") {
      out.out = value;
    } else if (name == "--format") {
      if (value != "safetensors" && value != "hf") {
        throw core::ConfigError("--format takes safetensors or hf, got '" + value + "'" + usage);
      }
      out.hf_format = value == "hf";
    } else if (value == "auto" || value == "live" || value == "lines") {
      out.progress = value == "live"    ? metrics::ProgressMode::kLive
                     : value == "lines" ? metrics::ProgressMode::kLines
                                        : metrics::ProgressMode::kAuto;
    } else {
      throw core::ConfigError("--progress takes auto, live or lines, got '" + value + "'" + usage);
    }
  }
  if (out.config_path.empty()) {
    throw core::ConfigError(
        (command == "export" ? "--config FILE.pbtxt or --run DIR" : "--config FILE.pbtxt") +
        std::string(" is required") + usage);
  }
  if (command == "export" && out.out.empty()) {
    throw core::ConfigError(std::string(out.hf_format ? "--out DIR" : "--out FILE.safetensors") +
                            " is required" + usage);
  }
  return out;
}

TrainConfig effective_config(const TrainArgs& args, std::vector<OverrideNote>& notes,
                             DataFiles files) {
  TrainConfig config = load_config_file(args.config_path);
  for (const std::string& set : args.sets) {
    if (std::optional<OverrideNote> note = apply_override(config, set)) {
      notes.push_back(std::move(*note));
    }
  }
  apply_defaults(config, args.config_path);
  validate(config, files);
  return config;
}

TrainConfig effective_config_noted(const TrainArgs& parsed, int rank, DataFiles files) {
  std::vector<OverrideNote> notes;
  try {
    TrainConfig config = effective_config(parsed, notes, files);
    if (rank == 0) {
      for (const OverrideNote& note : notes)
        std::fprintf(stderr, "mantissa: note: %s\n", note.text.c_str());
    }
    return config;
  } catch (const core::ConfigError& e) {
    const std::string what = e.what();
    const size_t equals = what.find(" = ");
    if (equals == std::string::npos) throw;
    const std::string field = what.substr(0, equals);
    const bool field_was_set =
        std::any_of(parsed.sets.begin(), parsed.sets.end(), [&](const std::string& set) {
          const std::string path = set.substr(0, set.find('='));
          return field == path || field.starts_with(path + ".");
        });
    // The last note of each member: a member selected twice took its defaults the last time.
    std::vector<const OverrideNote*> last;
    for (const OverrideNote& note : notes) {
      std::erase_if(last, [&](const OverrideNote* n) { return n->selected == note.selected; });
      last.push_back(&note);
    }
    std::string joined;
    for (const OverrideNote* note : last) {
      if (cites_a_value_of(what, note->selected)) {
        joined += (joined.empty() ? "" : "; ") + note->text;
      }
    }
    if (joined.empty() || field_was_set) throw;
    throw core::ConfigError(what + " (note: " + joined + ")");
  }
}

}  // namespace mantissa::launcher
