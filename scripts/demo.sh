#!/usr/bin/env bash
# The README's demo: set up this machine, build, and train a small GPT on the built-in
# synthetic corpus in BF16 on the CPU with two data-parallel ranks. The loss falls from ~5.5
# (a uniform guess over 256 bytes) to ~1.5 in about a minute on two cores.
#
#   scripts/demo.sh                 (BUILD_DIR=... to use another build directory)
#
# The run goes to runs/demo/ (effective config, log/rank<R>.jsonl, checkpoints/); each demo
# starts afresh.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/setup.sh
build_dir=${BUILD_DIR:-build}

# Open MPI refuses to start as root unless told it is intended.
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# mpirun hands the ranks pipes, not the terminal, so ask for the live line explicitly.
progress=lines
if [ -t 2 ]; then progress=live; fi

rm -rf runs/demo
# Unbound, the two ranks divide the machine's cores between them (mpirun would bind each to one).
exec mpirun --oversubscribe -np 2 --bind-to none \
  "$build_dir/bin/mantissa" train --config configs/demo.pbtxt --progress "$progress"
