#!/usr/bin/env bash
# Set up, build and run the whole test suite (what CI runs).
#   scripts/run-tests.sh [extra ctest arguments, e.g. -L core]
#   CTEST_JOBS=1 scripts/run-tests.sh        one test at a time (default: one per core)
# Tests that need the whole machine (integration, multinode) are RUN_SERIAL; the longest ones
# carry a COST so that a fresh build, which has no timing history, starts them first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${CTEST_JOBS:-$(nproc)}" "$@"
