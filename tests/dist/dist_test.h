// Shared by the dist tests: every test program runs under mpirun, one process per rank, and
// its main (dist_test_main.cpp) owns the World. Each rank runs every test; a failure on any
// rank fails the program on every rank.
#pragma once

#include "dist/world.h"

namespace mantissa::dist::testing {

World& world();

}  // namespace mantissa::dist::testing
