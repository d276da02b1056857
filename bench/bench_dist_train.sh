#!/usr/bin/env bash
# Data-parallel CPU training of the reference configuration (../shared/REFERENCE.md: GPT of
# 10.8M parameters, 8 sequences of 256 tokens per step over all ranks) on 2 ranks x 1 thread:
# mantissa BF16 with gradient sync (BF16 and FP8 reduce) and without it (same compute, no
# communication), next to PyTorch DDP over gloo (FP32, 2 processes x 1 thread) when
# /usr/bin/python3 has torch. Figures only.
#   bench/bench_dist_train.sh [build dir] [steps]
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
anchor=../shared/anchors/torch_cpu_gpt.py
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe -np 2 --bind-to none)

"${mpirun[@]}" "$build/bin/bench_dist_train" nosync "$steps" bf16
"${mpirun[@]}" "$build/bin/bench_dist_train" sync "$steps" bf16 BF16
"${mpirun[@]}" "$build/bin/bench_dist_train" sync "$steps" bf16 FP8_E4M3
"${mpirun[@]}" "$build/bin/bench_dist_train" nosync "$steps" fp32
"${mpirun[@]}" "$build/bin/bench_dist_train" sync "$steps" fp32 FP32
if /usr/bin/python3 -c "import torch" 2>/dev/null && [ -f "$anchor" ]; then
  # DDP: one process per rank; tokens_per_s is per process, the total is their sum.
  for rank in 0 1; do
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29517 WORLD_SIZE=2 RANK=$rank \
      /usr/bin/python3 "$anchor" --threads 1 --B 4 --steps "$steps" &
  done
  wait
else
  echo "torch anchor skipped: /usr/bin/python3 has no torch or $anchor is missing"
fi
