#!/usr/bin/env bash
# Set up a fresh Debian 12 machine and build mantissa into build/: the build's libraries,
# clang for the fuzzers, and the real servers the integration tests start (Prometheus,
# Pushgateway, Slurm with munge).
#
#   scripts/setup.sh            install missing packages (apt-get), configure, build
#   BUILD_DIR=... JOBS=... scripts/setup.sh
#
# The CUDA toolkit is expected under /usr/local/cuda (it is not a Debian package); without
# it the build continues without the CUDA backend.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  build-essential cmake ninja-build pkg-config
  libopenblas-dev libopenblas0-pthread
  libgtest-dev libgmock-dev
  openmpi-bin libopenmpi-dev
  libprotobuf-dev protobuf-compiler
  prometheus-cpp-dev libcurl4-openssl-dev
  libsentencepiece-dev
  clang libclang-rt-14-dev libomp-dev
  python3
  python3-torch  # the PyTorch references of tests/models/hf_reference.py
)

scripts/install-packages.sh "${packages[@]}"
# The servers the integration tests start themselves (Prometheus, Pushgateway, Slurm).
scripts/install-integration-deps.sh

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build_dir" -j "$jobs"
echo "setup: built into $build_dir/"
