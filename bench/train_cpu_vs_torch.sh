#!/usr/bin/env bash
# Single-process CPU training throughput and peak memory of mantissa (FP32, BF16) next to
# Debian's PyTorch (FP32, BF16 autocast) on the reference configuration, in one run.
#   bench/train_cpu_vs_torch.sh [build dir] [steps]
# Needs python3-torch and libopenblas0-pthread (apt-get install -y python3-torch).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
anchor=../shared/anchors/torch_cpu_gpt.py
export OMP_NUM_THREADS=2

for p in fp32 bf16; do "$build/bin/bench_train_cpu" "$p" "$steps"; done
if /usr/bin/python3 -c "import torch" 2>/dev/null && [ -f "$anchor" ]; then
  /usr/bin/python3 "$anchor" --threads 2 --steps "$steps"
  /usr/bin/python3 "$anchor" --threads 2 --steps 2 --bf16
else
  echo "torch anchor skipped: /usr/bin/python3 has no torch or $anchor is missing"
fi
