#!/usr/bin/env bash
# Set up, build and run the whole test suite (what CI runs).
#   scripts/run-tests.sh [extra ctest arguments, e.g. -L core]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure "$@"
