// How a benchmark ends on an error. Anything thrown (a malformed MANTISSA_CPU_* switch, a
// failed allocation, a backend error) is printed as "<benchmark>: <message>" and the benchmark
// exits 1, instead of ending in std::terminate (abort, exit 134, a core dump where enabled).
// A command line it cannot measure (UsageError, from Arguments) is printed as "usage: <line>"
// and the benchmark exits 2.
#pragma once

#include <charconv>
#include <cmath>
#include <cstdio>
#include <exception>
#include <initializer_list>
#include <limits>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>

namespace mantissa::bench {

// what() is the benchmark's usage line.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A benchmark's positional arguments (argv[1] on), read strictly: each getter returns its
// fallback where the argument is absent and throws UsageError where it is present but not what
// the usage line allows, so that a typo never runs the benchmark on a default.
class Arguments {
 public:
  Arguments(int argc, char** argv, const char* usage) : argc_(argc), argv_(argv), usage_(usage) {}

  int count() const { return argc_ - 1; }
  void expect_at_most(int n) const {
    if (count() > n) fail();
  }
  // For arguments that come in groups, all of a group or none.
  void expect_count_in(std::initializer_list<int> counts) const {
    for (const int c : counts) {
      if (count() == c) return;
    }
    fail();
  }

  // Argument i as a whole number in [lo, hi] (the whole text: "12x", "1e3" and " 1" fail).
  template <class Int>
  Int whole(int i, std::type_identity_t<Int> fallback, std::type_identity_t<Int> lo,
            std::type_identity_t<Int> hi = std::numeric_limits<Int>::max()) const {
    if (i > count()) return fallback;
    Int value{};
    if (!parse(argv_[i], value) || value < lo || value > hi) fail();
    return value;
  }
  // Argument i as a finite number in [lo, hi].
  double number(int i, double fallback, double lo,
                double hi = std::numeric_limits<double>::max()) const {
    if (i > count()) return fallback;
    double value = 0.0;
    if (!parse(argv_[i], value) || !std::isfinite(value) || value < lo || value > hi) fail();
    return value;
  }
  // Argument i as one of `words`.
  std::string word(int i, const char* fallback, std::initializer_list<const char*> words) const {
    if (i > count()) return fallback;
    for (const char* w : words) {
      if (std::string_view(argv_[i]) == w) return w;
    }
    fail();
  }

  // For what the getters cannot check: a relation between arguments, say.
  [[noreturn]] void fail() const { throw UsageError(usage_); }

 private:
  template <class T>
  static bool parse(std::string_view text, T& value) {
    const char* end = text.data() + text.size();
    const auto [stop, error] = std::from_chars(text.data(), end, value);
    return error == std::errc() && stop == end;
  }

  int argc_;
  char** argv_;
  const char* usage_;
};

// body()'s exit status, or 1 once what it threw is printed (2 for a UsageError).
template <class Body>
int exit_status_of(const char* benchmark, Body&& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    std::fprintf(stderr, "usage: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);  // the figures so far, before the error that ends them
    std::fprintf(stderr, "%s: %s\n", benchmark, e.what());
    return 1;
  }
}

// The same under mpirun: what one rank threw ends the whole job (dist::World::abort, exit 1),
// so that no rank is left waiting in a collective for it. A UsageError is the exception: every
// rank reads the same arguments and throws it alike, before any collective, so each returns 2
// and rank 0 alone prints the usage.
template <class World, class Body>
int exit_status_of(const char* benchmark, const World& world, Body&& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    if (world.rank() == 0) std::fprintf(stderr, "usage: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    world.abort(1, std::string(benchmark) + ": " + e.what());
  }
}

}  // namespace mantissa::bench
