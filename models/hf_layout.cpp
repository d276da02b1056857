#include "models/hf_layout.h"

#include <charconv>
#include <cstring>

namespace mantissa::models {

std::vector<int64_t> HfTensor::shape() const {
  if (cols == 0) return {rows};
  return transpose ? std::vector<int64_t>{cols, rows} : std::vector<int64_t>{rows, cols};
}

void to_hf(const HfTensor& t, const float* parameter, float* hf) {
  const int64_t width = t.cols ? t.cols : 1;
  const float* rows = parameter + t.row_begin * width;
  if (!t.transpose) {
    std::memcpy(hf, rows, static_cast<size_t>(t.numel()) * sizeof(float));
    return;
  }
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.cols; ++c) hf[c * t.rows + r] = rows[r * t.cols + c];
}

void from_hf(const HfTensor& t, const float* hf, float* parameter) {
  const int64_t width = t.cols ? t.cols : 1;
  float* rows = parameter + t.row_begin * width;
  if (!t.transpose) {
    std::memcpy(rows, hf, static_cast<size_t>(t.numel()) * sizeof(float));
    return;
  }
  for (int64_t r = 0; r < t.rows; ++r)
    for (int64_t c = 0; c < t.cols; ++c) rows[r * t.cols + c] = hf[c * t.rows + r];
}

std::string hf_json(int64_t value) {
  return std::to_string(value);
}

namespace {

// The text Python's json.dumps writes for a float (transformers writes config.json with it):
// the shortest digits that read back exactly, fixed-point for 0 and between 1e-4 and 1e16 (with
// ".0" when integral: 10000.0), scientific outside (1e-05).
template <typename T>
std::string shortest(T value) {
  char text[64];
  const T magnitude = value < 0 ? -value : value;
  const bool fixed = magnitude == T(0) || (magnitude >= T(1e-4) && magnitude < T(1e16));
  const auto result =
      std::to_chars(text, text + sizeof text, value,
                    fixed ? std::chars_format::fixed : std::chars_format::scientific);
  std::string s(text, result.ptr);
  if (fixed && s.find('.') == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::string hf_json(float value) {
  return shortest(value);
}

std::string hf_json(double value) {
  return shortest(value);
}

}  // namespace mantissa::models
