#!/bin/sh
# A benchmark given a malformed MANTISSA_CPU_AVX512_CONVERT (which every CPU benchmark reads)
# must print "<name>: MANTISSA_CPU_AVX512_CONVERT=maybe: must be 0 ..." and exit 1, not end
# in std::terminate (exit 134).
#
#   check_error_exit.sh NAME COMMAND [ARGS...]   (COMMAND may be mpirun ... NAME ...)
set -u
name=$1
shift
stderr_file=$(mktemp)
trap 'rm -f "$stderr_file"' EXIT
MANTISSA_CPU_AVX512_CONVERT=maybe "$@" >/dev/null 2>"$stderr_file"
status=$?
if [ "$status" -ne 1 ]; then
  echo "FAIL: $name exited $status, expected 1; its stderr:" >&2
  cat "$stderr_file" >&2
  exit 1
fi
if ! grep -q "$name: MANTISSA_CPU_AVX512_CONVERT=maybe: must be 0" "$stderr_file"; then
  echo "FAIL: $name's stderr does not name the benchmark and the switch:" >&2
  cat "$stderr_file" >&2
  exit 1
fi
echo "$name: exit 1 with the message"
