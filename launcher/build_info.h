// What this executable was built from, for `mantissa --version`, the run's start line, the
// checkpoints it writes (TrainState.written_by) and the mantissa_build_info metric: after a
// redeploy, an operator can tell which build ran which step.
#pragma once

#include <string>

namespace mantissa::launcher {

// The project's version in CMakeLists.txt, "0.2.0".
std::string build_version();
// The commit the sources were at (12 hex digits), "-dirty" appended when tracked files differed
// from it; "unknown" for a build outside a git checkout.
std::string build_commit();
// "mantissa 0.2.0 (commit 0af4188c1a2b)"
std::string build_name();
// `mantissa --version`: build_name(), then a line each for the build type, the CUDA backend,
// NCCL, MPI and protobuf (the libraries this process loaded, where they can say), and the CPU's
// code paths.
std::string version_report();

}  // namespace mantissa::launcher
