// Fields of a TrainConfig reached by path and set from text, through protobuf reflection: what
// `--set` and the default table share (internal to the config library).
#pragma once

#include <google/protobuf/message.h>

#include <string>
#include <string_view>

namespace mantissa::launcher {

// Parses protobuf text format into `out`, the message at `path` in the config ("model.mlp";
// empty: the config itself). The parser's first error (the rest are usually consequences of
// it) becomes a core::ConfigError "<source>:<line>:<column>: <what>" (1-based), an unknown
// field or enum value named by its path.
void parse_text(std::string_view text, const std::string& source, google::protobuf::Message& out,
                const std::string& path = "");

struct FieldRef {
  google::protobuf::Message* message = nullptr;  // holds the field
  const google::protobuf::FieldDescriptor* field = nullptr;
  // When the walk went through an unselected oneof member while another member was selected:
  // the member it selected and the one it dropped ("model.gpt2", "model.llama").
  std::string selected, dropped;
  std::string path;  // the field's, as resolved ("model.mlp")
};

// Walks `path` ("precision.loss_scale.init") from `root`. Intermediate messages are created as
// needed, which for a oneof member selects it (and drops the member selected before); with
// `skip_unselected_oneof` a path through an unselected oneof member resolves to nothing instead
// (defaults apply only to the model and data source in use). A name that is not a field throws
// core::ConfigError listing the fields.
FieldRef resolve(google::protobuf::Message& root, std::string_view path,
                 bool skip_unselected_oneof);

// Sets (or, for a repeated field, appends) one value given as text: numbers range-checked for
// the field's width, enum names, true/false, strings as written, and for a message field its
// text-format body with or without braces ("{}", "{n_embd: 32}").
void set_from_text(const FieldRef& ref, std::string_view text);

}  // namespace mantissa::launcher
