#include "launcher/config/config_diff.h"

#include <google/protobuf/text_format.h>

#include <algorithm>

#include "core/error.h"
#include "core/strings.h"
#include "launcher/config/config.h"

namespace mantissa::launcher {

namespace {

namespace pb = google::protobuf;

// A field's value as text format writes it (repeated fields as a list).
std::string value_text(const pb::Message& message, const pb::FieldDescriptor& field) {
  const pb::Reflection& r = *message.GetReflection();
  if (!field.is_repeated()) {
    std::string text;
    pb::TextFormat::PrintFieldValueToString(message, &field, -1, &text);
    return text;
  }
  std::string text = "[";
  for (int i = 0; i < r.FieldSize(message, &field); ++i) {
    std::string item;
    pb::TextFormat::PrintFieldValueToString(message, &field, i, &item);
    text += (i > 0 ? ", " : "") + item;
  }
  return text + "]";
}

// The selected member's name of `oneof`, or "none".
std::string member_name(const pb::Message& message, const pb::OneofDescriptor& oneof) {
  const pb::FieldDescriptor* member =
      message.GetReflection()->GetOneofFieldDescriptor(message, &oneof);
  return member != nullptr ? member->name() : "none";
}

void collect(const pb::Message& before, const pb::Message& after, const std::string& prefix,
             std::vector<std::string>& out) {
  const pb::Descriptor& type = *before.GetDescriptor();
  const pb::Reflection& rb = *before.GetReflection();
  const pb::Reflection& ra = *after.GetReflection();
  for (int o = 0; o < type.oneof_decl_count(); ++o) {
    const pb::OneofDescriptor& oneof = *type.oneof_decl(o);
    const std::string was = member_name(before, oneof), is = member_name(after, oneof);
    if (was != is) out.push_back(prefix + oneof.name() + " " + was + " -> " + is);
  }
  for (int f = 0; f < type.field_count(); ++f) {
    const pb::FieldDescriptor& field = *type.field(f);
    const std::string path = prefix + field.name();
    if (field.cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE && !field.is_repeated()) {
      // A oneof member held by one side only was reported with its oneof.
      if (field.containing_oneof() != nullptr &&
          !(rb.HasField(before, &field) && ra.HasField(after, &field))) {
        continue;
      }
      collect(rb.GetMessage(before, &field), ra.GetMessage(after, &field), path + ".", out);
      continue;
    }
    const std::string was = value_text(before, field), is = value_text(after, field);
    if (was != is) out.push_back(path + " " + was + " -> " + is);
  }
}

// The fields set in `filled` but not in `raw` (fields with presence only: those the default
// table fills in), with their values in `current`.
void collect_unset(const pb::Message& raw, const pb::Message& filled, const pb::Message& current,
                   const std::string& prefix, std::vector<UnrecordedSetting>& out) {
  const pb::Descriptor& type = *filled.GetDescriptor();
  const pb::Reflection& rr = *raw.GetReflection();
  const pb::Reflection& rf = *filled.GetReflection();
  const pb::Reflection& rc = *current.GetReflection();
  for (int f = 0; f < type.field_count(); ++f) {
    const pb::FieldDescriptor& field = *type.field(f);
    if (field.is_repeated() || !rf.HasField(filled, &field)) continue;
    const std::string path = prefix + field.name();
    if (field.cpp_type() == pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      collect_unset(rr.GetMessage(raw, &field), rf.GetMessage(filled, &field),
                    rc.GetMessage(current, &field), path + ".", out);
    } else if (!rr.HasField(raw, &field)) {
      out.push_back({path, value_text(current, field)});
    }
  }
}

}  // namespace

std::vector<std::string> config_differences(const TrainConfig& before, const TrainConfig& after) {
  std::vector<std::string> out;
  collect(before, after, "", out);
  return out;
}

std::vector<std::string> model_differences(const TrainConfig& before, const TrainConfig& after) {
  std::vector<std::string> out;
  for (std::string& d : config_differences(before, after)) {
    if (d.starts_with("model.") && !d.starts_with("model.init_from ")) out.push_back(std::move(d));
  }
  return out;
}

void require_recorded_model(const std::string& config_text, int64_t step, const std::string& dir,
                            const TrainConfig& config,
                            std::initializer_list<std::string_view> may_change,
                            const std::string& advice) {
  const std::optional<TrainConfig> recorded = recorded_config(config_text);
  if (!recorded) return;
  std::vector<std::string> changed = model_differences(*recorded, config);
  std::erase_if(changed, [&](const std::string& c) {
    return std::any_of(may_change.begin(), may_change.end(), [&](std::string_view path) {
      return c.starts_with(path) && c.size() > path.size() && c[path.size()] == ' ';
    });
  });
  if (changed.empty()) return;
  throw core::ConfigError("checkpoint step " + std::to_string(step) + " in " + dir +
                          " was trained with another model config (checkpoint -> this config: " +
                          core::join(changed, ", ") + "): " + advice);
}

std::string misfit_explanation(const std::string& checkpoint_config_text, const TrainConfig& config,
                               const std::string& advice) {
  const std::optional<TrainConfig> recorded =
      checkpoint_config_text.empty() ? std::nullopt : recorded_config(checkpoint_config_text);
  if (!recorded) return " (" + advice + ")";
  const std::string list = core::join(model_differences(*recorded, config), ", ");
  if (!list.empty()) return "; its model config differs: " + list + " (" + advice + ")";
  return "; its model config is this run's, so another build of mantissa laid the parameters "
         "out otherwise: the build that wrote the checkpoint can still resume or export it";
}

std::vector<UnrecordedSetting> unrecorded_settings(const std::string& config_text,
                                                   const TrainConfig& config) {
  try {
    const TrainConfig raw = parse_config_text(config_text, "the checkpoint's config");
    TrainConfig filled = raw;
    apply_defaults(filled, "the checkpoint's config");
    std::vector<UnrecordedSetting> out;
    collect_unset(raw, filled, config, "", out);
    return out;
  } catch (const core::ConfigError&) {
    return {};
  }
}

std::optional<TrainConfig> recorded_config(const std::string& config_text) {
  try {
    // Defaults filled in as for a run's config: a field added since the checkpoint was saved
    // then compares as the default it ran with, not as 0.
    TrainConfig config = parse_config_text(config_text, "the checkpoint's config");
    apply_defaults(config, "the checkpoint's config");
    return config;
  } catch (const core::ConfigError&) {
    return std::nullopt;
  }
}

}  // namespace mantissa::launcher
