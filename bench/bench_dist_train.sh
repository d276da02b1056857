#!/usr/bin/env bash
# Data-parallel CPU training of the reference configuration (a GPT-2 of 10.84M parameters:
# vocab 256, T = 256, d = 384, 6 layers, 6 heads; 8 sequences of 256 tokens per step over all
# ranks) on 2 ranks x 1 thread: mantissa BF16 with gradient sync (BF16 and FP8 reduce) and
# without it (same compute, no communication), FP8_HYBRID (BF16 reduce), and FP32, next to
# PyTorch DDP over gloo (FP32, 2 processes x 1 thread, bench/torch_gpt.py). Figures only.
#   bench/bench_dist_train.sh [build dir] [steps]
# Installs python3-torch and libopenblas0-pthread when missing (scripts/install-bench-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mpirun=(mpirun --oversubscribe -np 2 --bind-to none)

torch_ok=1
scripts/install-bench-deps.sh || torch_ok=0
/usr/bin/python3 -c "import torch" 2>/dev/null || torch_ok=0

"$build/bin/bench_cpu_paths"
"${mpirun[@]}" "$build/bin/bench_dist_train" nosync "$steps" bf16
"${mpirun[@]}" "$build/bin/bench_dist_train" sync "$steps" bf16 BF16
"${mpirun[@]}" "$build/bin/bench_dist_train" sync "$steps" bf16 FP8_E4M3
"${mpirun[@]}" "$build/bin/bench_dist_train" sync "$steps" fp8 BF16
"${mpirun[@]}" "$build/bin/bench_dist_train" nosync "$steps" fp32
"${mpirun[@]}" "$build/bin/bench_dist_train" sync "$steps" fp32 FP32
if [ "$torch_ok" = 1 ]; then
  # One process per rank, started by torch_gpt.py itself; tokens_per_s is per process, and
  # the total line is their sum.
  /usr/bin/python3 bench/torch_gpt.py --ranks 2 --threads 1 --steps "$steps"
else
  echo "torch anchor skipped: /usr/bin/python3 has no torch (scripts/install-bench-deps.sh failed)"
fi
