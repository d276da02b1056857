#!/bin/sh
# Runs a CPU test again with some of the CPU backend's fast paths switched off (the environment
# ctest gives it, e.g. MANTISSA_CPU_AVX512_CONVERT=0), so that the code other CPUs run is tested
# on this one. Where this CPU takes the same paths with the switches as without them (it lacks
# the features they turn off), the test's plain run has already covered them: this one reports
# skipped (exit 77) and names the paths.
#
#   run-on-other-cpu-paths.sh BENCH_CPU_PATHS TEST [ARGS...]
set -eu
describe=$1
shift
switched=$("$describe")
plain=$(unset MANTISSA_CPU_BF16_GEMM MANTISSA_CPU_AVX512_CONVERT MANTISSA_CPU_AMX && "$describe")
if [ "$switched" = "$plain" ]; then
  echo "skipped: this CPU takes the same paths with these switches as without them ($plain)"
  exit 77
fi
echo "$switched"
exec "$@"
