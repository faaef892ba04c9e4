#!/usr/bin/env bash
# Installs every Debian package that Ember's build, tests, benchmarks and examples need.
# Debian 12, as root (or through sudo). Packages already present are left alone, and the
# package index is refreshed only when something is missing. The CUDA toolkit is optional
# and not installed here: CMake turns the CUDA backend on when it finds nvcc.
set -euo pipefail

PACKAGES=(
  build-essential
  cmake
  ninja-build
  ccache
  g++
  libeigen3-dev
  libgtest-dev
  libgmock-dev
  googletest
  libbenchmark-dev
  nlohmann-json3-dev
  libyaml-cpp-dev
  zlib1g-dev
  libgloo-dev
  libdnnl-dev
  iproute2
  clang
)

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

as_root=()
if [[ $(id -u) -ne 0 ]]; then
  if ! command -v sudo >/dev/null; then
    echo "install_deps: missing packages (${missing[*]}); run this script as root" >&2
    exit 1
  fi
  as_root=(sudo)
fi

echo "install_deps: installing ${missing[*]}"
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update
"${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y --no-install-recommends "${missing[@]}"
