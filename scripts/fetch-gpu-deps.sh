#!/usr/bin/env bash
# Fetch the Debian packages that a core build needs and a GPU check machine lacks, and unpack
# them (without installing anything) into .deps/, which scripts/gpu-check.sh then uses.
#
#   scripts/fetch-gpu-deps.sh        run here, on a Debian 12 machine with package access
#
# The GPU machine has nvcc, CMake and ninja but no GoogleTest, OpenBLAS or pkg-config, and
# cannot reach a package registry. What it needs:
#   libgtest-dev              GTestConfig.cmake, headers, static libgtest(_main).a
#   libopenblas-pthread-dev   cblas.h and openblas.pc (libopenblas-dev is an empty meta package)
#   libopenblas0-pthread      libopenblas.so.0 (libopenblas0 is an empty meta package)
#   libgfortran5 libquadmath0 what libopenblas.so.0 links against
#   pkgconf-bin libpkgconf3   pkg-config itself, for CMake's pkg_check_modules
# Static OpenBLAS archives, the reference BLAS/LAPACK shims and documentation are dropped to
# keep .deps/ small enough to travel with the working tree (about 40 MB).
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(
  libgtest-dev
  libopenblas-pthread-dev libopenblas0-pthread
  libgfortran5 libquadmath0
  pkgconf-bin libpkgconf3
)

rm -rf .deps
mkdir -p .deps/debs
cd .deps/debs
# As root, apt would rather download as its sandbox user, who cannot write here.
sandbox=()
[ "$(id -u)" -ne 0 ] || sandbox=(-o APT::Sandbox::User=root)
if ! apt-get download "${sandbox[@]}" "${packages[@]}"; then
  # An empty or stale package list: refresh it once and try again.
  apt-get update -qq
  apt-get download "${sandbox[@]}" "${packages[@]}"
fi
cd ../..

for deb in .deps/debs/*.deb; do
  dpkg -x "$deb" .deps
done
rm -rf .deps/debs .deps/usr/share/doc .deps/usr/share/lintian .deps/usr/share/man
openblas=.deps/usr/lib/x86_64-linux-gnu/openblas-pthread
rm -f "$openblas"/*.a "$openblas"/libblas.* "$openblas"/liblapack.*

test -f "$openblas/pkgconfig/openblas.pc"
test -f .deps/usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake
echo "fetch-gpu-deps: $(du -sh .deps | cut -f1) in .deps/"
