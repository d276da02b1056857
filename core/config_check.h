// Range checks of option values, in one wording for every module that checks its own options
// and for the launcher's config validation. One failed rule is one core::ConfigError:
//   "<path> = <value>: <rule>"        e.g. "loss_scale.min = 0: must be > 0"
// A module names the field by its own section of the config ("loss_scale.min"); the launcher
// adds the rest of the config path ("precision.loss_scale.min = 0: must be > 0").
#pragma once

#include <cfloat>
#include <charconv>
#include <cmath>
#include <concepts>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

#include "core/error.h"

namespace mantissa::core {

// Throws ConfigError("<path> = <value>: <rule>") unless `ok`.
inline void require(bool ok, std::string_view path, std::string_view value, std::string_view rule) {
  if (!ok) {
    throw ConfigError(std::string(path) + " = " + std::string(value) + ": " + std::string(rule));
  }
}

// The shortest text that reads back as `value`, as a user would write it: "0.5", "1e+39", "nan".
// A float option prints as its own shortest text ("0.9"), not as the double it widens to
// (0.89999997615814209).
template <std::floating_point T>
std::string format_number(T value) {
  char buffer[64];
  const auto [end, ec] = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, end);
}

inline void at_least(std::string_view path, int64_t value, int64_t min) {
  require(value >= min, path, std::to_string(value), "must be >= " + std::to_string(min));
}

inline void in_range(std::string_view path, int64_t value, int64_t min, int64_t max) {
  require(value >= min && value <= max, path, std::to_string(value),
          "must lie in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
}

// Finite and > 0 (NaN and inf fail, the rule then saying "finite").
template <std::floating_point T>
void positive(std::string_view path, T value) {
  require(std::isfinite(value) && value > 0, path, format_number(value),
          std::isfinite(value) ? "must be > 0" : "must be a finite number > 0");
}

// Finite and >= 0.
template <std::floating_point T>
void non_negative(std::string_view path, T value) {
  require(std::isfinite(value) && value >= 0, path, format_number(value),
          std::isfinite(value) ? "must be >= 0" : "must be a finite number >= 0");
}

// For a value the code keeps as a float, after the value's own rule: 0, or a magnitude among
// the normal floats (a smaller one would round to 0 or lose its precision, a larger one to inf).
inline void fits_float(std::string_view path, double value) {
  const double magnitude = std::fabs(value);
  // The bounds in full: the float's shortest texts (1.1754944e-38, 3.4028235e+38) read as
  // doubles outside them, which this refuses.
  char bounds[64];
  std::snprintf(bounds, sizeof bounds, "[%.17g, %.17g]", static_cast<double>(FLT_MIN),
                static_cast<double>(FLT_MAX));
  require(magnitude == 0 || (magnitude >= FLT_MIN && magnitude <= FLT_MAX), path,
          format_number(value),
          std::string("is kept as a float: its magnitude must lie in ") + bounds);
}

// [0, 1) when `max_open`, else [0, 1] (NaN fails).
template <std::floating_point T>
void in_unit_range(std::string_view path, T value, bool max_open) {
  const bool ok = value >= 0 && (max_open ? value < 1 : value <= 1);
  require(ok, path, format_number(value), max_open ? "must lie in [0, 1)" : "must lie in [0, 1]");
}

}  // namespace mantissa::core
