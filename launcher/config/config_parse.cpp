// A TrainConfig and text: the config file (protobuf text format) in, `--set` overrides, and the
// effective config printed back out.
#include <google/protobuf/text_format.h>

#include <string_view>

#include "core/error.h"
#include "core/read_file.h"
#include "launcher/config/config.h"
#include "launcher/config/config_fields.h"

namespace mantissa::launcher {

TrainConfig parse_config_text(std::string_view text, const std::string& source) {
  TrainConfig config;
  parse_text(text, source, config);
  return config;
}

TrainConfig load_config_file(const std::string& path) {
  return parse_config_text(core::read_whole_file(path, "config"), path);
}

std::optional<OverrideNote> apply_override(TrainConfig& config, std::string_view assignment) {
  const std::string prefix = "--set " + std::string(assignment) + ": ";
  const size_t eq = assignment.find('=');
  if (eq == std::string_view::npos || eq == 0) {
    throw core::ConfigError(prefix + "expected path.to.field=value");
  }
  try {
    const FieldRef ref = resolve(config, assignment.substr(0, eq), false);
    set_from_text(ref, assignment.substr(eq + 1));
    if (ref.dropped.empty()) return std::nullopt;
    return OverrideNote{ref.selected, "--set " + std::string(assignment) + " selects " +
                                          ref.selected + " in place of " + ref.dropped +
                                          ", whose settings are dropped"};
  } catch (const core::ConfigError& e) {
    throw core::ConfigError(prefix + e.what());
  }
}

std::string config_value(const TrainConfig& config, std::string_view path) {
  const std::string prefix = "--get " + std::string(path) + ": ";
  TrainConfig walked = config;  // resolve may create the messages on its way
  FieldRef ref;
  try {
    ref = resolve(walked, path, true);
  } catch (const core::ConfigError& e) {
    throw core::ConfigError(prefix + e.what());
  }
  const google::protobuf::Reflection* r = ref.field ? ref.message->GetReflection() : nullptr;
  // A path through an unselected oneof member resolves to nothing; one that ends at it, to a
  // member that is not set.
  if (ref.field == nullptr ||
      (ref.field->containing_oneof() && !r->HasField(*ref.message, ref.field))) {
    throw core::ConfigError(prefix +
                            "the config does not use it (another member of its oneof "
                            "is selected)");
  }
  const google::protobuf::FieldDescriptor& field = *ref.field;
  const int count = field.is_repeated() ? r->FieldSize(*ref.message, &field) : 1;
  std::string text;
  for (int i = 0; i < count; ++i) {
    const int index = field.is_repeated() ? i : -1;
    std::string value;
    if (field.cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
      value = field.is_repeated() ? r->GetRepeatedString(*ref.message, &field, i)
                                  : r->GetString(*ref.message, &field);
    } else {
      google::protobuf::TextFormat::PrintFieldValueToString(*ref.message, &field, index, &value);
    }
    // A message's text-format body ends its last field's line already.
    text += value.ends_with('\n') ? value : value + "\n";
  }
  return text;
}

std::string to_text(const TrainConfig& config) {
  std::string text;
  google::protobuf::TextFormat::PrintToString(config, &text);
  return text;
}

}  // namespace mantissa::launcher
