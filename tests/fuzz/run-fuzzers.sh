#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (AddressSanitizer on the whole library stack) in a
# build directory of their own and runs each one for a bounded time, starting from the fixed
# corpus in tests/fuzz/corpus/<target>/.
#
#   tests/fuzz/run-fuzzers.sh [BUILD_DIR]        default build-fuzz
#   FUZZ_SECONDS=300 FUZZ_TARGETS="manifest" tests/fuzz/run-fuzzers.sh
#
# A crash stops the run with exit 1 and leaves the reproducer in BUILD_DIR/artifacts/<target>/;
# once the bug is fixed, copy the reproducer into tests/fuzz/corpus/<target>/ so the regular
# test fuzz_corpus_<target> keeps it fixed. Exits 77 (ctest: skipped) when clang is missing.
set -euo pipefail
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
build_dir=${1:-$source_dir/build-fuzz}
seconds=${FUZZ_SECONDS:-15}
targets=${FUZZ_TARGETS:-config manifest token_shards safetensors}
jobs=${JOBS:-$(nproc)}

cxx=${FUZZ_CXX:-clang++}
if ! command -v "$cxx" >/dev/null; then
  echo "run-fuzzers: skipped: $cxx not found (scripts/setup.sh installs clang)"
  exit 77
fi
cc=${cxx/clang++/clang}
# The project's top-level CMakeLists requires OpenMP, which clang takes from libomp-dev.
if ! echo '#include <omp.h>' | "$cxx" -fopenmp -x c++ -fsyntax-only - 2>/dev/null; then
  echo "run-fuzzers: $cxx has no OpenMP (omp.h): install libomp-dev (scripts/setup.sh)"
  exit 1
fi

# -O1 -g: fast enough to fuzz, precise enough to read a sanitizer report. CUDA off: the
# fuzzed code is all host code (tests/fuzz/CMakeLists.txt builds only what it needs).
cmake -S "$source_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" -DMANTISSA_CUDA=OFF -DMANTISSA_FUZZ=ON \
  -DCMAKE_CXX_FLAGS="-O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address" \
  -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address" >"$build_dir.configure.log" 2>&1 ||
  { cat "$build_dir.configure.log"; exit 1; }
fuzzers=()
for t in $targets; do fuzzers+=("fuzz_$t"); done
cmake --build "$build_dir" -j "$jobs" --target "${fuzzers[@]}"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
status=0
for t in $targets; do
  work="$build_dir/corpus/$t"            # grows while fuzzing; the source tree stays as it is
  artifacts="$build_dir/artifacts/$t/"
  mkdir -p "$work" "$artifacts"
  echo "run-fuzzers: fuzz_$t for ${seconds}s"
  # -close_fd_mask=2: the targets report every rejected input on stderr; libFuzzer's own
  # report still appears.
  if ! "$build_dir/bin/fuzz_$t" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=4096 \
      -max_len=8192 -close_fd_mask=2 -print_final_stats=1 -artifact_prefix="$artifacts" \
      "$work" "$source_dir/tests/fuzz/corpus/$t" 2>&1 | tail -25; then
    status=1  # pipefail: the fuzzer's own exit status
  fi
done
if [ "$status" -ne 0 ]; then
  echo "run-fuzzers: FAILED: see the reports above and the reproducers under $build_dir/artifacts/"
  exit 1
fi
echo "run-fuzzers: every target ran ${seconds}s without a failure"
