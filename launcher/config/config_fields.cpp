#include "launcher/config/config_fields.h"

#include <google/protobuf/io/tokenizer.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/text_format.h>

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "core/strings.h"

namespace mantissa::launcher {

namespace pb = google::protobuf;

namespace {

std::string field_names(const pb::Descriptor& type) {
  std::vector<std::string> names;
  for (int i = 0; i < type.field_count(); ++i) names.push_back(type.field(i)->name());
  return core::join(names, ", ");
}

std::string enum_names(const pb::EnumDescriptor& type) {
  std::vector<std::string> names;
  for (int i = 0; i < type.value_count(); ++i) names.push_back(type.value(i)->name());
  return core::join(names, ", ");
}

// The text between `before` and the next `after` in `message`, when `message` starts with
// `before`.
std::optional<std::string> between(const std::string& message, std::string_view before,
                                   std::string_view after) {
  if (!message.starts_with(before)) return std::nullopt;
  const size_t end = message.find(after, before.size());
  if (end == std::string::npos) return std::nullopt;
  return message.substr(before.size(), end - before.size());
}

class IgnoreErrors : public pb::io::ErrorCollector {
 public:
  void AddError(int, pb::io::ColumnNumber, const std::string&) override {}
};

// Text-format tokens read in order, with the fields of the messages they stand in.
class TokenWalk {
 public:
  explicit TokenWalk(std::string_view text)
      : input_(text.data(), static_cast<int>(text.size())), tokens_(&input_, &ignore_) {
    tokens_.set_comment_style(pb::io::Tokenizer::SH_COMMENT_STYLE);
  }

  // The next token before (line, column), or nullptr at that place (or the end).
  const pb::io::Tokenizer::Token* next_before(int line, pb::io::ColumnNumber column) {
    if (!tokens_.Next()) return nullptr;
    const pb::io::Tokenizer::Token& t = tokens_.current();
    if (t.line > line || (t.line == line && t.column >= column)) {
      at_place_ = t.line == line && t.column == column;
      return nullptr;
    }
    if (t.type == pb::io::Tokenizer::TYPE_IDENTIFIER) {
      field_ = t.text;
    } else if (t.text == "[") {
      // A list after "field:", or a colon-less "field [{...}]" (not after a value such as
      // "-inf"); else the bracket of an extension or Any name ("[x.y]: ..."), which holds no
      // values of a field.
      const bool list = seen(0) == ":" || (seen_identifier_ && seen(1) != ":" && seen(1) != "-");
      lists_.push_back(list ? field_ : std::string());
    } else if (t.text == "]" && !lists_.empty()) {
      lists_.pop_back();
    } else if (t.text == "{" || t.text == "<") {
      // A message in a list ("f: [{...}, {...}]") belongs to the list's field.
      const bool listed = !lists_.empty() && (seen(0) == "[" || seen(0) == ",");
      path_.push_back(listed ? lists_.back() : field_);
    } else if ((t.text == "}" || t.text == ">") && !path_.empty()) {
      path_.pop_back();
    }
    seen_[1] = seen_[0];
    seen_[0] = t.text;
    seen_identifier_ = t.type == pb::io::Tokenizer::TYPE_IDENTIFIER;
    return &t;
  }

  // The fields of the messages the last token stands in, outermost first.
  const std::vector<std::string>& path() const { return path_; }
  // After next_before() returned nullptr: the field a value at the place is given to ("steps:
  // VALUE", "steps: -VALUE", "steps: [1, VALUE]"), or nullopt when the place holds no value.
  std::optional<std::string> field_of_value() const {
    if (!at_place_) return std::nullopt;
    const std::string& before = seen(0) == "-" ? seen(1) : seen(0);
    if (!lists_.empty() && (before == "[" || before == ",")) {
      if (lists_.back().empty()) return std::nullopt;
      return lists_.back();
    }
    if (before == ":") return field_;
    return std::nullopt;
  }

 private:
  // The text of the last token read (0) and of the one before it (1).
  const std::string& seen(int back) const { return seen_[back]; }

  IgnoreErrors ignore_;
  pb::io::ArrayInputStream input_;
  pb::io::Tokenizer tokens_;
  std::vector<std::string> path_, lists_;  // lists_: the fields of the [ ... ] open ("": none)
  std::string field_;                      // the last identifier read
  std::string seen_[2];
  bool seen_identifier_ = false;  // whether the last token read was an identifier
  bool at_place_ = false;
};

// A token's place in text format: its line and column (0-based, as protobuf counts them) and
// the fields of the messages it stands in, outermost first (["precision", "loss_scale"]).
struct Place {
  int line = 0;
  pb::io::ColumnNumber column = 0;
  std::vector<std::string> path;
};

// The place of the last identifier `name` before (line, column) in text-format `text`.
std::optional<Place> last_identifier_before(std::string_view text, const std::string& name,
                                            int line, pb::io::ColumnNumber column) {
  TokenWalk walk(text);
  std::optional<Place> found;
  while (const pb::io::Tokenizer::Token* t = walk.next_before(line, column)) {
    if (t->type == pb::io::Tokenizer::TYPE_IDENTIFIER && t->text == name) {
      found = Place{t->line, t->column, walk.path()};
    }
  }
  return found;
}

// The path of the field whose value starts at (line, column) in text-format `text`
// ("run.steps"), or nullopt when no value starts there.
std::optional<std::string> field_of_value_at(std::string_view text, int line,
                                             pb::io::ColumnNumber column) {
  TokenWalk walk(text);
  while (walk.next_before(line, column)) {
  }
  const std::optional<std::string> field = walk.field_of_value();
  if (!field) return std::nullopt;
  std::vector<std::string> parts = walk.path();
  parts.push_back(*field);
  return core::join(parts, ".");
}

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

  // "<source>:<line>:<column>: <message>", 1-based as editors count. An unknown field or enum
  // value, which the parser names by its own name alone and places at the token after it, is
  // placed where it stands and said as --set says it: the field's path in the config (`root`
  // being the message at `root_path`), and the fields or values there are. A value the parser
  // refuses ("Expected integer, got: 2.5") is named by its field's path.
  std::string describe(const std::string& source, std::string_view text, const pb::Descriptor& root,
                       const std::string& root_path) const {
    std::ostringstream out;
    out << source;
    if (const std::optional<std::string> said = explained(text, root, root_path))
      return out.str() + *said;
    if (line_ >= 0) out << ":" << line_ + 1 << ":" << column_ + 1;
    out << ": ";
    if (const std::optional<std::string> field =
            line_ >= 0 ? field_of_value_at(text, line_, column_) : std::nullopt) {
      out << (root_path.empty() ? "" : root_path + ".") << *field << ": ";
    }
    out << (message_.empty() ? "cannot parse" : message_);
    return out.str();
  }

 private:
  // ":<line>:<column>: <message>" for an unknown field or enum value; nullopt for other errors
  // (or for words of a protobuf release that differ).
  std::optional<std::string> explained(std::string_view text, const pb::Descriptor& root,
                                       const std::string& root_path) const {
    std::optional<std::string> name, value;  // the field's name; the enum value it was given
    if ((value = between(message_, "Unknown enumeration value of \"", "\""))) {
      const size_t at = message_.find("\" for field \"");
      if (at != std::string::npos) name = between(message_.substr(at), "\" for field \"", "\"");
    } else if (const size_t at = message_.find(" has no field named \""); at != std::string::npos) {
      name = between(message_.substr(at), " has no field named \"", "\"");
    }
    if (!name || line_ < 0) return std::nullopt;
    const std::optional<Place> place =
        last_identifier_before(text, value ? *value : *name, line_, column_);
    if (!place) return std::nullopt;
    const pb::Descriptor* type = &root;
    for (const std::string& field : place->path) {
      const pb::FieldDescriptor* descriptor = type->FindFieldByName(field);
      if (descriptor == nullptr || descriptor->message_type() == nullptr) return std::nullopt;
      type = descriptor->message_type();
    }
    std::vector<std::string> parts = place->path;
    if (!root_path.empty()) parts.insert(parts.begin(), root_path);
    const std::string path = core::join(parts, ".");
    std::ostringstream out;
    out << ":" << place->line + 1 << ":" << place->column + 1 << ": ";
    if (value) {
      const pb::FieldDescriptor* field = type->FindFieldByName(*name);
      if (field == nullptr || field->enum_type() == nullptr) return std::nullopt;
      out << (path.empty() ? "" : path + ".") << *name << " must be one of "
          << enum_names(*field->enum_type()) << ", got '" << *value << "'";
    } else {
      out << (path.empty() ? root.name() : path) << " has no field '" << *name
          << "' (fields: " << field_names(*type) << ")";
    }
    return out.str();
  }

  int line_ = -1;
  pb::io::ColumnNumber column_ = 0;
  std::string message_;
};

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
  const bool whole = end == text.data() + text.size() && !text.empty();
  if (ec == std::errc::result_out_of_range && whole) {
    // Too small rounds to 0, as the config file's parser takes it; too large is refused.
    value = std::strtod(std::string(text).c_str(), nullptr);
    if (std::isinf(value)) {
      throw core::ConfigError("value '" + std::string(text) + "' does not fit " + field.name() +
                              " (a double: magnitudes up to 1.8e+308)");
    }
    return value;
  }
  if (ec != std::errc() || !whole) {
    throw core::ConfigError(field.name() + " takes a number, got '" + std::string(text) + "'");
  }
  return value;
}

}  // namespace

void parse_text(std::string_view text, const std::string& source, pb::Message& out,
                const std::string& path) {
  FirstError errors;
  pb::TextFormat::Parser parser;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(std::string(text), &out))
    throw core::ConfigError(errors.describe(source, text, *out.GetDescriptor(), path));
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
    if (i + 1 == parts.size()) return {message, field, selected, dropped, walked};
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

void set_from_text(const FieldRef& ref, std::string_view text) {
  pb::Message& message = *ref.message;
  const pb::FieldDescriptor& field = *ref.field;
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
        throw core::ConfigError(field.name() + " must be one of " + enum_names(type) + ", got '" +
                                std::string(text) + "'");
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
      parse_text(body, field.name() + " value", *parsed, ref.path);
      pb::Message* target =
          add ? r.AddMessage(&message, &field) : r.MutableMessage(&message, &field);
      target->MergeFrom(*parsed);
      return;
    }
  }
}

}  // namespace mantissa::launcher
