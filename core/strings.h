// Text built from a sequence: one place for the ", "-joined lists that messages name.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace mantissa::core {

// The items' text with `separator` between them ("a, b, c"; "" for none). `text` makes an
// item's text (a std::string or what converts to one); by default the item is its text.
template <typename Range, typename Text = std::identity>
std::string join(const Range& items, std::string_view separator, Text text = {}) {
  std::string joined;
  bool first = true;
  for (const auto& item : items) {
    if (!first) joined += separator;
    joined += std::invoke(text, item);
    first = false;
  }
  return joined;
}

}  // namespace mantissa::core
