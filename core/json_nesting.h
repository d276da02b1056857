// A bound on how deeply JSON read from users' files (safetensors headers, Hugging Face
// config.json and index files) nests, checked before protobuf's JSON parser sees it: that
// parser takes time quadratic in the depth (a 1 MB header nested 500,000 deep ran for hours,
// deaf to SIGTERM), while the files it reads nest three or four deep.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

namespace mantissa::core {

inline constexpr int kMaxJsonNesting = 64;

// The offset of the first '{' or '[' in `json` that opens a level deeper than `limit`, or
// nullopt. Brackets inside strings (escapes included) do not count; nothing else is checked.
std::optional<size_t> json_too_deep_at(std::string_view json, int limit = kMaxJsonNesting);

}  // namespace mantissa::core
