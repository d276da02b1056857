#!/usr/bin/env bash
# Set up, build and run the whole test suite (what CI runs).
#   scripts/run-tests.sh [extra ctest arguments, e.g. -L core]
#   CTEST_JOBS=1 scripts/run-tests.sh        one test at a time (default: one more than cores)
# Tests that need the whole machine (integration, multinode) are RUN_SERIAL; the longest ones
# carry a COST so that a fresh build, which has no timing history, starts them first.
# One test more than cores: tests spend part of their time waiting (process starts, sockets,
# sleeps), and the third keeps both cores of a 2-core machine busy then. Measured there on a
# warm build: ctest -j3 539 s, -j2 602 s. The tests' OpenMP threads sleep at barriers
# (CMakeLists.txt), so the extra test costs the others little.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Which CPU kernels this machine's tests run (AMX, AVX512-BF16 or AVX2 paths): a green run on
# one machine says nothing about the paths its CPU lacks.
"${BUILD_DIR:-build}/bin/bench_cpu_paths"
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${CTEST_JOBS:-$(($(nproc) + 1))}" "$@"
