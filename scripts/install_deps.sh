#!/usr/bin/env bash
# Installs every Debian package that Ember's build, tests, benchmarks and examples need, and the
# Python tools some tests check Ember's output with (TensorBoard's event reader; Hugging Face
# transformers, which also needs Debian's python3-torch, not installed here: it is large) in a
# virtual environment at $EMBER_PYTOOLS (default ~/.cache/ember-pytools) that sees Debian's
# Python packages.
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
  # dnnl-config.cmake calls find_package(OpenCL); libdnnl-dev only recommends its package.
  ocl-icd-opencl-dev
  iproute2
  clang
  chromium
  doxygen
  python3-venv
  # The CPU PyTorch that transformers loads Ember's checkpoints with (interop test); the tools
  # environment sees Debian's Python packages.
  python3-torch
)

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done

# Pinned so that a test's reader does not change under it.
PYTOOLS=${EMBER_PYTOOLS:-$HOME/.cache/ember-pytools}
PYTOOLS_REQUIREMENTS=(tensorboard==2.21.0 transformers==4.45.2 safetensors==0.8.0)

install_pytools() {
  if [[ -x "$PYTOOLS/bin/python" ]] && "$PYTOOLS/bin/python" -c 'import tensorboard, transformers, safetensors' 2>/dev/null; then
    return
  fi
  echo "install_deps: Python tools into $PYTOOLS (${PYTOOLS_REQUIREMENTS[*]})"
  # Not fatal: without them the tests that need them skip and say why.
  rm -rf "$PYTOOLS"
  if ! { /usr/bin/python3 -m venv --system-site-packages "$PYTOOLS" &&
         "$PYTOOLS/bin/pip" install --quiet --disable-pip-version-check "${PYTOOLS_REQUIREMENTS[@]}"; }; then
    echo "install_deps: could not install the Python tools; tests that read with them will skip" >&2
  fi
}

if ((${#missing[@]} == 0)); then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  install_pytools
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
install_pytools
