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
  prometheus-cpp-dev
  clang libclang-rt-14-dev libomp-dev
  python3
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}"
fi

# The servers the integration tests start themselves (Prometheus, Pushgateway, Slurm).
scripts/install-integration-deps.sh

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
cmake -S . -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build "$build_dir" -j "$jobs"
echo "setup: built into $build_dir/"
