#!/bin/sh
# A benchmark smoke run whose figure is one line: it must exit 0 and print a line matching
# PATTERN (grep -E) on stdout. (ctest's PASS_REGULAR_EXPRESSION alone ignores the exit status.)
#
#   check_output_line.sh PATTERN COMMAND [ARGS...]
set -u
pattern=$1
shift
output=$("$@")
status=$?
printf '%s\n' "$output"
if [ "$status" -ne 0 ]; then
  echo "FAIL: $1 exited $status" >&2
  exit 1
fi
if ! printf '%s\n' "$output" | grep -Eq "$pattern"; then
  echo "FAIL: $1 printed no line matching '$pattern'" >&2
  exit 1
fi
