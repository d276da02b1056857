#!/usr/bin/env bash
# Install what the benchmarks' PyTorch anchor (bench/torch_gpt.py) runs on: Debian's PyTorch
# for /usr/bin/python3, and the pthread OpenBLAS, without which that PyTorch falls back to the
# reference BLAS and trains about 15 times slower. Debian 12 packages, idempotent.
set -euo pipefail
exec "$(dirname "$0")/install-packages.sh" python3-torch libopenblas0-pthread
