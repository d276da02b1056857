#!/bin/sh
# A benchmark given an argument it cannot measure must print "usage: <name> ..." once (under
# mpirun, rank 0 alone) and exit 2.
#
#   check_usage_exit.sh NAME COMMAND [ARGS...]   (COMMAND may be mpirun ... NAME ...)
set -u
name=$1
shift
stderr_file=$(mktemp)
trap 'rm -f "$stderr_file"' EXIT
"$@" >/dev/null 2>"$stderr_file"
status=$?
if [ "$status" -ne 2 ]; then
  echo "FAIL: $name exited $status, expected 2; its stderr:" >&2
  cat "$stderr_file" >&2
  exit 1
fi
if [ "$(grep -c "^usage: $name" "$stderr_file")" -ne 1 ]; then
  echo "FAIL: $name's stderr does not hold its usage line once:" >&2
  cat "$stderr_file" >&2
  exit 1
fi
echo "$name: exit 2 with the usage line"
