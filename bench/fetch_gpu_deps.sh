#!/usr/bin/env bash
# Downloads, on a Debian 12 machine, the Debian packages Ember builds against (headers, CMake
# packages and shared libraries) into one folder, for a GPU machine that has CUDA but none of
# them and no network: bench/gpu_check.sh unpacks them into a private prefix there. The folder
# (about 12 MiB) is ignored by git, so a device call names it: carry=[".gpudeps"]
# (bench/README_gpu.md).
#
#   bash bench/fetch_gpu_deps.sh [DIR]      # default DIR: .gpudeps (ignored by git)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
DIR="${1:-.gpudeps}"
PACKAGES=(
  libeigen3-dev nlohmann-json3-dev zlib1g-dev
  libdnnl2 libdnnl-dev ocl-icd-libopencl1 ocl-icd-opencl-dev opencl-c-headers
  libgloo0 libgloo-dev libhiredis0.14 libhiredis-dev libibverbs1 libibverbs-dev
  libnl-3-200 libnl-route-3-200 libnl-3-dev libnl-route-3-dev
  libyaml-cpp0.7 libyaml-cpp-dev
  libbenchmark1debian libbenchmark-dev libgtest-dev libgmock-dev googletest
)
mkdir -p "$DIR"
DIR="$(cd "$DIR" && pwd)"
# apt's sandbox user must be able to write there; download as root into a scratch folder.
scratch="$(mktemp -d)"
chmod 777 "$scratch"
(cd "$scratch" && apt-get download "${PACKAGES[@]}")
mv "$scratch"/*.deb "$DIR"/
rmdir "$scratch"
echo "fetched $(ls "$DIR"/*.deb | wc -l) packages ($(du -sh "$DIR" | cut -f1)) into $DIR; carry it with each device call"
