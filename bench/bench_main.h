// How a benchmark ends on an error. Anything thrown (a malformed MANTISSA_CPU_* switch, a
// failed allocation, a backend error) is printed as "<benchmark>: <message>" and the benchmark
// exits 1, instead of ending in std::terminate (abort, exit 134, a core dump where enabled).
#pragma once

#include <cstdio>
#include <exception>
#include <string>

namespace mantissa::bench {

// body()'s exit status, or 1 once what it threw is printed.
template <class Body>
int exit_status_of(const char* benchmark, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fflush(stdout);  // the figures so far, before the error that ends them
    std::fprintf(stderr, "%s: %s\n", benchmark, e.what());
    return 1;
  }
}

// The same under mpirun: what one rank threw ends the whole job (dist::World::abort, exit 1),
// so that no rank is left waiting in a collective for it.
template <class World, class Body>
int exit_status_of(const char* benchmark, const World& world, Body&& body) {
  try {
    return body();
  } catch (const std::exception& e) {
    std::fflush(stdout);
    world.abort(1, std::string(benchmark) + ": " + e.what());
  }
}

}  // namespace mantissa::bench
