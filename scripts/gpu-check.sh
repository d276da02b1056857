#!/usr/bin/env bash
# The GPU check: build core, models and the MPI-free part of dist with the GPU tests and
# benchmarks, run them, print a summary.
#
#   scripts/gpu-check.sh                 from the repository root, on the GPU machine
#   BUILD_DIR=... JOBS=... LOG_DIR=... CUDA_ARCHS=... STAGE=... TEST_TIMEOUT=... BENCH_TIMEOUT=...
#   scripts/gpu-check.sh
#
# CUDA_ARCHS (default: the GPU's own compute capability when nvidia-smi can tell, else the
# project's default, 80 and 90): building for one architecture halves the CUDA compile time
# (sm_90 alone: 136 steps, 272 s on 2 cores, about a minute on 16).
# STAGE: all (default), build (configure and build only) or test (run what an earlier
# STAGE=build left in BUILD_DIR). A lent machine stays warm only about 30 s after a call and a
# new one starts bare, so STAGE=all in one call is the way to run it there.
# Each GPU test is stopped after TEST_TIMEOUT s (default 150) and each benchmark after
# BENCH_TIMEOUT s (default 150), so that one that hangs cannot use up the machine. Warnings are
# not errors here (MANTISSA_WERROR=OFF): a newer compiler's new warning must not stop the build.
# Where the CUDA toolkit has no NCCL, the NCCL of Python's nvidia-nccl wheel is used.
# On a lent machine, LOG_DIR=$OUT/logs brings the logs back.
#
# The GPU machine has nvcc, CMake and ninja but no GoogleTest, OpenBLAS or pkg-config: run
# scripts/fetch-gpu-deps.sh on a machine with package access first and bring .deps/ along.
# Without .deps/ the system's packages are used, so the same script works on a development
# machine (where the GPU tests report "skipped: no CUDA device" and the benchmarks
# "no CUDA device").
#
# Exit status: non-zero when configuring, building or a GPU test fails, or a benchmark crashes
# or trains to a non-finite loss; also when a GPU test reports skipped where nvidia-smi sees a
# GPU, or, on compute capability 9.0 or newer, passes over any case (a GTEST_SKIP for another
# reason, a case printed "not run" or "not on this device"). Every test's output is kept in
# LOG_DIR/ctest-output.log.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$PWD
build_dir=${BUILD_DIR:-build-gpu}
jobs=${JOBS:-$(nproc)}
log_dir=${LOG_DIR:-$build_dir/gpu-check-logs}
stage=${STAGE:-all}
deps=$root/.deps
mkdir -p "$log_dir"
rm -f "$log_dir"/*.log  # a summary speaks of this call only
case $stage in all | build | test) ;; *)
  echo "gpu-check: STAGE=$stage: expected all, build or test" >&2
  exit 2
  ;;
esac

test_timeout=${TEST_TIMEOUT:-150}
bench_timeout=${BENCH_TIMEOUT:-150}
cmake_args=(-S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DMANTISSA_CORE_ONLY=ON
  -DMANTISSA_GPU_TEST_TIMEOUT="$test_timeout" -DMANTISSA_WERROR=OFF)
gpus=$(nvidia-smi -L 2>/dev/null | grep -c "^GPU")
# The first GPU's compute capability times 10 (90 for Hopper): the architecture to build for,
# and 0 where unknown for the skip rule below.
detected=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
  head -n 1 | tr -d '.[:space:]')
capability=$detected
[[ $capability =~ ^[0-9]+$ ]] || capability=0
archs=${CUDA_ARCHS:-$detected}
if [ -n "$archs" ]; then
  cmake_args+=(-DCMAKE_CUDA_ARCHITECTURES="$archs")
fi
if [ -d "$deps/usr" ]; then
  libs=$deps/usr/lib/x86_64-linux-gnu
  # Debian's openblas.pc names absolute /usr paths (and is linked into pkgconfig/ by
  # update-alternatives at install time, which dpkg -x skips): use a copy that points into
  # .deps, written here because the checkout's path differs from machine to machine.
  mkdir -p "$deps/pkgconfig"
  sed -E "s#^(prefix|libdir|includedir)=/usr/#\1=$deps/usr/#" \
    "$libs/openblas-pthread/pkgconfig/openblas.pc" >"$deps/pkgconfig/openblas.pc"
  export PKG_CONFIG_PATH="$deps/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
  export LD_LIBRARY_PATH="$libs/openblas-pthread:$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # The prefix also leads CMake to GTestConfig.cmake and to .deps/usr/bin/pkgconf; GTest_DIR
  # names the former outright for hosts whose CMake does not search Debian's multiarch paths.
  cmake_args+=(-DCMAKE_PREFIX_PATH="$deps/usr" -DGTest_DIR="$libs/cmake/GTest"
    -DPKG_CONFIG_EXECUTABLE="$deps/usr/bin/pkgconf")
  echo "gpu-check: using the packages in $deps"
fi
# NCCL: the toolkit's where it has one, else the one Python's nvidia-nccl wheel installed (its
# library carries only the versioned name, so it is named outright).
if ! ls /usr/local/cuda/lib64/libnccl.so* >/dev/null 2>&1; then
  wheel=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(list(nvidia.nccl.__path__)[0] + "/"))' 2>/dev/null)
  if [ -n "$wheel" ] && [ -f "$wheel/lib/libnccl.so.2" ]; then
    cmake_args+=(-DMANTISSA_NCCL_LIBRARY="$wheel/lib/libnccl.so.2"
      -DMANTISSA_NCCL_INCLUDE_DIR="$wheel/include")
    export LD_LIBRARY_PATH="$wheel/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    echo "gpu-check: using the NCCL in $wheel"
  fi
fi

# step NAME COMMAND...: runs one step with its output in $log_dir/NAME.log (and on screen),
# and records its status and time for the summary.
names=()
statuses=()
times=()
failed=0
record() {
  names+=("$1")
  statuses+=("$2")
  times+=("$3")
  case $2 in ok | "ok, "* | skipped) ;; *) failed=1 ;; esac
}
step() {
  local name=$1
  shift
  echo "=== $name: $*"
  local start=$SECONDS
  "$@" 2>&1 | tee "$log_dir/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -eq 0 ]; then
    record "$name" ok $((SECONDS - start))
  else
    record "$name" "FAILED ($rc)" $((SECONDS - start))
  fi
  return "$rc"
}

# The GPU and its driver first, for the record (not a step that can fail the check: old
# drivers know fewer query fields). A driver older than the toolkit also shows up as the
# runtime's error on stderr of every test.
if [ "$gpus" -gt 0 ]; then
  nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv 2>&1 |
    tee "$log_dir/device.log" || true
fi

# Keep going past a target that does not compile (ninja -k 0): whatever did build still gets
# tested, which is worth more than nothing on a machine that is lent for minutes.
gpu_targets=(test_gpu_dtype test_gpu_gemm test_gpu_block_fp8 test_gpu_ops test_gpu_attention
  test_gpu_flash_attention
  test_gpu_llama_ops test_gpu_decode test_gpu_nccl test_gpu_train bench_gpu_gemm bench_gpu_ops
  bench_attention bench_gpu_train)
# Tests run after a build step that configured (whatever of it compiled), or on what an
# earlier STAGE=build left.
testable=0
if [ "$stage" = test ]; then
  [ -f "$build_dir/CTestTestfile.cmake" ] && testable=1
elif step configure cmake "${cmake_args[@]}"; then
  testable=1
  step build cmake --build "$build_dir" -j "$jobs" --target "${gpu_targets[@]}" -- -k 0
fi
# The cases test $1 passed over although it ran on a GPU (ctest's output of every test, which
# --output-on-failure leaves out for those that passed): a GTEST_SKIP with a reason other than
# "no CUDA device" (no FP8 tensor cores, too little shared memory) and the cases a test printed
# as "not run" or "not on this device" (a scale mode the loaded cuBLASLt lacks), except those
# another architecture's GPU runs ("... compute capability ...": MXFP8 scales on Hopper, the
# Hopper-only scales on Blackwell). How many, one per case.
skipped_cases() {
  awk -v t="$1" '/^[0-9]+\/[0-9]+ Testing: / { on = ($3 == t) }
      on && (/^\[  SKIPPED \] [A-Za-z]/ || /: not run: / ||
        (/: not on this device: / && !/compute capability/))' \
    "$log_dir/ctest-output.log" | sed -E 's/ \([0-9]+ ms\)$//' | sort -u | wc -l
}
if [ "$stage" != build ] && [ "$testable" = 1 ]; then
  step ctest ctest --test-dir "$build_dir" -L gpu --output-on-failure
  cp "$build_dir/Testing/Temporary/LastTest.log" "$log_dir/ctest-output.log" 2>/dev/null ||
    : >"$log_dir/ctest-output.log"
  # One line per test in the summary too, from ctest's "N/M Test #K: NAME ... STATUS T sec".
  for test in "${gpu_targets[@]}"; do
    case $test in test_*)
      read -r status seconds < <(awk -v t="$test" '$2 == "Test" && $4 == t {
          rest = $0; sub(/.*\.\.\.+ */, "", rest); sub(/^\*+/, "", rest)
          n = split(rest, f, / +/); print f[1], int(f[n - 1]) }' "$log_dir/ctest.log" | tail -n 1)
      case ${status:-} in
        Passed)
          # On compute capability 9.0 or newer (the lent H100 and H200) every case must run.
          passed_over=$(skipped_cases "$test")
          if [ "$gpus" -gt 0 ] && [ "$passed_over" -gt 0 ]; then
            if [ "$capability" -ge 90 ]; then
              record "$test" "passed over $passed_over case(s)" "$seconds"
            else
              record "$test" "ok, $passed_over case(s) not for this GPU" "$seconds"
            fi
          else
            record "$test" ok "$seconds"
          fi
          ;;
        # Skipped means "no CUDA device": an error where nvidia-smi sees one.
        Skipped)
          if [ "$gpus" -gt 0 ]; then
            record "$test" "skipped, but nvidia-smi sees a GPU" "$seconds"
          else
            record "$test" skipped "$seconds"
          fi
          ;;
        "") record "$test" "not run" 0 ;;
        *) record "$test" "$status" "$seconds" ;;
      esac
      ;;
    esac
  done
  # PyTorch's GEMM in the same run, the anchor of bench_gpu_gemm's 8192^3 row (where python3
  # has PyTorch: on the lent machines it does).
  if python3 -c "import torch" >/dev/null 2>&1; then
    step torch_gpu_gemm timeout -k 10 "$bench_timeout" python3 bench/torch_gpu_gemm.py
  fi
  # bench_attention's argument picks its GPU half (the attention op next to its GEMMs).
  for bench in bench_gpu_gemm bench_gpu_ops bench_attention bench_gpu_train; do
    args=()
    [ "$bench" = bench_attention ] && args=(gpu)
    if [ -x "$build_dir/bin/$bench" ]; then
      # Line-buffered, so that the rows printed before a timeout or a crash are kept.
      step "$bench" timeout -k 10 "$bench_timeout" stdbuf -oL "$build_dir/bin/$bench" "${args[@]}"
    else
      : >"$log_dir/$bench.log"
      record "$bench" "not built" 0
    fi
  done
elif [ "$stage" = test ]; then
  record ctest "no build in $build_dir (run STAGE=build first)" 0
fi

# One line per step; for the tests and benchmarks also the line that matters most.
note() {
  local log=$log_dir/$1.log
  [ -f "$log" ] || return 0
  case $1 in
    ctest) grep -E "tests passed|tests failed" "$log" | tail -n 1 ;;
    bench_gpu_gemm) grep -E "^(no CUDA device|8192\^3)" "$log" | head -n 1 ;;
    torch_gpu_gemm) tail -n 1 "$log" ;;
    bench_gpu_ops)
      # The copy anchor, and the slowest gradient-sync cast (pack or unpack) next to it.
      grep -E "^(no CUDA device|copy f32)" "$log" | sed -E 's/ +/ /g'
      grep -E "^  (pack|unpack) " "$log" | awk '{ v = $(NF - 2); sub(/%/, "", v); print v "\t" $0 }' |
        sort -n | head -n 1 | cut -f2 | sed -E 's/ +/ /g; s/^ /slowest grad-sync cast: /'
      grep -E "^  (1x128|128x128|per row)" "$log" |
        awk '{ v = $(NF - 2); sub(/%/, "", v); print v "\t" $0 }' | sort -n | head -n 1 | cut -f2 |
        sed -E 's/ +/ /g; s/^ /slowest block quantisation: /'
      ;;
    bench_attention) grep -E "^(no CUDA device|  (attention|flash) (forward|backward)|  flash attention: not run)" "$log" |
      sed -E 's/ +/ /g' ;;
    bench_gpu_train) grep -E "^(no CUDA device|BF16 |FP8 )" "$log" |
      sed -E 's/= +/=/g; s/ +/ /g; s/(tokens_per_s|model_tflops)=[^ ]* ?//g' ;;
  esac
}
echo
echo "=== gpu-check summary (logs in $log_dir)"
printf '%-16s %-14s %8s  %s\n' step status seconds note
for i in "${!names[@]}"; do
  printf '%-16s %-14s %8s  %s\n' "${names[$i]}" "${statuses[$i]}" "${times[$i]}" \
    "$(note "${names[$i]}" | paste -sd '|' - | cut -c1-700)"
done
if [ -f "$log_dir/ctest.log" ]; then
  grep -F "***" "$log_dir/ctest.log" | sed 's/^/  /'
fi
exit "$failed"
