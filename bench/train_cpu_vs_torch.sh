#!/usr/bin/env bash
# Single-process CPU training throughput and peak memory of mantissa (FP32, BF16, FP8_HYBRID)
# next to Debian's PyTorch (FP32, BF16 autocast) on the reference configuration, in one run: a GPT-2
# of 10.84M parameters (vocab 256, T = 256, d = 384, 6 layers, 6 heads), 8 sequences per step,
# 2 threads. PyTorch runs bench/torch_gpt.py, the same model and optimizer.
#   bench/train_cpu_vs_torch.sh [build dir] [steps]
# Installs python3-torch and libopenblas0-pthread when missing (scripts/install-bench-deps.sh).
# Figures only; the CPU paths line says which code paths ran, mantissa's and PyTorch's.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-6}
export OMP_NUM_THREADS=2

torch_ok=1
scripts/install-bench-deps.sh || torch_ok=0
/usr/bin/python3 -c "import torch" 2>/dev/null || torch_ok=0

for p in fp32 bf16 fp8; do "$build/bin/bench_train_cpu" "$p" "$steps"; done
if [ "$torch_ok" = 1 ]; then
  /usr/bin/python3 bench/torch_gpt.py --threads 2 --steps "$steps"
  # Without AVX512-BF16 (AVX2 CPUs) PyTorch 1.13's BF16 autocast runs at a few dozen tokens/s:
  # two steps are enough to see it.
  /usr/bin/python3 bench/torch_gpt.py --threads 2 --steps 2 --bf16
  # mantissa's switches reach mantissa alone: oneDNN still takes this CPU's BF16 instructions
  # (and with ONEDNN_MAX_CPU_ISA=AVX2 its BF16 matmuls fail), so it stands for no AVX2 CPU.
  if [ "${MANTISSA_CPU_BF16_GEMM:-1}" = 0 ] && grep -qwE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
    echo "note: torch BF16 autocast ran on this CPU's own BF16 instructions, not AVX2 alone:" \
      "on an AVX2-only CPU it runs at a few dozen tokens/s"
  fi
else
  echo "torch anchor skipped: /usr/bin/python3 has no torch (scripts/install-bench-deps.sh failed)"
fi
