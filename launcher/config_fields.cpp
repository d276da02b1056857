#include "launcher/config_fields.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/text_format.h>

#include <charconv>
#include <cstdint>
#include <limits>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/strings.h"

namespace mantissa::launcher {

namespace pb = google::protobuf;

namespace {

// Keeps the parser's first error (the rest are usually consequences of it).
class FirstError : public pb::io::ErrorCollector {
 public:
  void AddError(int line, pb::io::ColumnNumber column, const std::string& message) override {
    if (!message_.empty()) return;
    line_ = line;
    column_ = column;
    message_ = message;
  }
  void AddWarning(int, pb::io::ColumnNumber, const std::string&) override {}

  // "<source>:<line>:<column>: <message>", 1-based as editors count.
  std::string describe(const std::string& source) const {
    std::ostringstream out;
    out << source;
    if (line_ >= 0) out << ":" << line_ + 1 << ":" << column_ + 1;
    out << ": " << (message_.empty() ? "cannot parse" : message_);
    return out.str();
  }

 private:
  int line_ = -1;
  pb::io::ColumnNumber column_ = 0;
  std::string message_;
};

std::string field_names(const pb::Descriptor& type) {
  std::vector<std::string> names;
  for (int i = 0; i < type.field_count(); ++i) names.push_back(type.field(i)->name());
  return core::join(names, ", ");
}

std::vector<std::string_view> split_path(std::string_view path) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    parts.push_back(path.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

template <typename T>
T parse_integer(std::string_view text, const pb::FieldDescriptor& field) {
  T value{};
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec == std::errc::result_out_of_range) {
    throw core::ConfigError("value '" + std::string(text) + "' does not fit " + field.name() +
                            " (" + field.type_name() + ", " +
                            std::to_string(std::numeric_limits<T>::min()) + " to " +
                            std::to_string(std::numeric_limits<T>::max()) + ")");
  }
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw core::ConfigError(field.name() + " takes an integer (" + field.type_name() + "), got '" +
                            std::string(text) + "'");
  }
  return value;
}

double parse_double(std::string_view text, const pb::FieldDescriptor& field) {
  double value = 0.0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    throw core::ConfigError(field.name() + " takes a number, got '" + std::string(text) + "'");
  }
  return value;
}

}  // namespace

void parse_text(std::string_view text, const std::string& source, pb::Message& out) {
  FirstError errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &out))
    throw core::ConfigError(errors.describe(source));
}

FieldRef resolve(pb::Message& root, std::string_view path, bool skip_unselected_oneof) {
  const std::vector<std::string_view> parts = split_path(path);
  pb::Message* message = &root;
  std::string walked;
  std::string selected, dropped;
  for (size_t i = 0; i < parts.size(); ++i) {
    const pb::Descriptor& type = *message->GetDescriptor();
    const pb::FieldDescriptor* field = type.FindFieldByName(std::string(parts[i]));
    const std::string where = walked.empty() ? "TrainConfig" : walked;
    if (field == nullptr) {
      throw core::ConfigError(where + " has no field '" + std::string(parts[i]) +
                              "' (fields: " + field_names(type) + ")");
    }
    walked += (walked.empty() ? "" : ".") + field->name();
    if (i + 1 == parts.size()) return {message, field, selected, dropped};
    if (field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE || field->is_repeated()) {
      throw core::ConfigError(walked + " is a value, not a message with fields");
    }
    const pb::Reflection& reflection = *message->GetReflection();
    const pb::OneofDescriptor* oneof = field->containing_oneof();
    if (oneof != nullptr && !reflection.HasField(*message, field)) {
      if (skip_unselected_oneof) return {};
      if (const pb::FieldDescriptor* other = reflection.GetOneofFieldDescriptor(*message, oneof)) {
        const std::string parent = walked.substr(0, walked.size() - field->name().size());
        dropped = parent + other->name();
        selected = walked;
      }
    }
    message = reflection.MutableMessage(message, field);
  }
  return {};
}

void set_from_text(pb::Message& message, const pb::FieldDescriptor& field, std::string_view text) {
  const pb::Reflection& r = *message.GetReflection();
  const bool add = field.is_repeated();
  switch (field.cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32: {
      const auto v = parse_integer<int32_t>(text, field);
      add ? r.AddInt32(&message, &field, v) : r.SetInt32(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_INT64: {
      const auto v = parse_integer<int64_t>(text, field);
      add ? r.AddInt64(&message, &field, v) : r.SetInt64(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_UINT32: {
      const auto v = parse_integer<uint32_t>(text, field);
      add ? r.AddUInt32(&message, &field, v) : r.SetUInt32(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_UINT64: {
      const auto v = parse_integer<uint64_t>(text, field);
      add ? r.AddUInt64(&message, &field, v) : r.SetUInt64(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
      const double v = parse_double(text, field);
      add ? r.AddDouble(&message, &field, v) : r.SetDouble(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_FLOAT: {
      const auto v = static_cast<float>(parse_double(text, field));
      add ? r.AddFloat(&message, &field, v) : r.SetFloat(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_BOOL: {
      if (text != "true" && text != "false") {
        throw core::ConfigError(field.name() + " takes true or false, got '" + std::string(text) +
                                "'");
      }
      add ? r.AddBool(&message, &field, text == "true")
          : r.SetBool(&message, &field, text == "true");
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumDescriptor& type = *field.enum_type();
      const pb::EnumValueDescriptor* v = type.FindValueByName(std::string(text));
      if (v == nullptr) {
        std::vector<std::string> names;
        for (int i = 0; i < type.value_count(); ++i) names.push_back(type.value(i)->name());
        throw core::ConfigError(field.name() + " must be one of " + core::join(names, ", ") +
                                ", got '" + std::string(text) + "'");
      }
      add ? r.AddEnum(&message, &field, v) : r.SetEnum(&message, &field, v);
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      // Taken as it is, but a value in double quotes, as text format writes strings
      // (--set 'run.dir="a b"'), loses them.
      std::string_view value = text;
      if (value.size() >= 2 && value.front() == '"' && value.back() == '"' &&
          value.substr(1, value.size() - 2).find('"') == std::string_view::npos) {
        value = value.substr(1, value.size() - 2);
      }
      add ? r.AddString(&message, &field, std::string(value))
          : r.SetString(&message, &field, std::string(value));
      return;
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE: {
      // A message body in text format, with or without its braces: "{}", "{n_embd: 32}".
      std::string_view body = text;
      if (body.size() >= 2 && body.front() == '{' && body.back() == '}') {
        body = body.substr(1, body.size() - 2);
      }
      // The body's fields are merged in: those it names are set, the others keep their values
      // (as a field given twice in a config file), so --set 'model.gpt2={n_layer: 2}' leaves
      // the file's n_embd as it is.
      const std::unique_ptr<pb::Message> parsed(
          pb::MessageFactory::generated_factory()->GetPrototype(field.message_type())->New());
      parse_text(body, field.name() + " value", *parsed);
      pb::Message* target =
          add ? r.AddMessage(&message, &field) : r.MutableMessage(&message, &field);
      target->MergeFrom(*parsed);
      return;
    }
  }
}

}  // namespace mantissa::launcher
