#!/usr/bin/env bash
# Installs every Debian package that Ember's build, tests, benchmarks and examples need
# (scripts/debian-packages.txt), and the Python tools some tests check Ember's output with
# (scripts/pytools-requirements.txt: TensorBoard's event reader, Hugging Face transformers) in a
# virtual environment at $EMBER_PYTOOLS (default ~/.cache/ember-pytools) that sees Debian's
# Python packages (PyTorch is Debian's python3-torch).
# Debian 12, as root (or through sudo). Packages already present are left alone, and the
# package index is refreshed only when something is missing. The CUDA toolkit is optional
# and not installed here: CMake turns the CUDA backend on when it finds nvcc.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

# One name a line; '#' starts a comment (scripts/check_closure.py reads the same files).
read_list() { sed -e 's/#.*//' -e 's/[[:space:]]//g' "$1" | grep -v '^$'; }

REQUIREMENTS="$here/pytools-requirements.txt"
for list in "$here/debian-packages.txt" "$REQUIREMENTS"; do
  [[ -r $list ]] || { echo "install_deps: $list is missing" >&2; exit 1; }
done
mapfile -t PACKAGES < <(read_list "$here/debian-packages.txt")
mapfile -t PYTOOLS_REQUIREMENTS < <(read_list "$REQUIREMENTS")

is_installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q '^install ok installed$'
}

missing=()
for pkg in "${PACKAGES[@]}"; do
  is_installed "$pkg" || missing+=("$pkg")
done

PYTOOLS=${EMBER_PYTOOLS:-$HOME/.cache/ember-pytools}

# Whether the environment holds every pinned requirement at its pinned version.
pytools_current() {
  [[ -x "$PYTOOLS/bin/python" ]] || return 1
  "$PYTOOLS/bin/python" - "${PYTOOLS_REQUIREMENTS[@]}" 2>/dev/null <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
for requirement in sys.argv[1:]:
    name, _, pinned = requirement.partition("==")
    try:
        if version(name) != pinned:
            sys.exit(1)
    except PackageNotFoundError:
        sys.exit(1)
PY
}

install_pytools() {
  if pytools_current; then
    return
  fi
  echo "install_deps: Python tools into $PYTOOLS (${PYTOOLS_REQUIREMENTS[*]})"
  # Not fatal: without them the tests that need them skip and say why (and CI's skip check
  # fails on those skips).
  rm -rf "$PYTOOLS"
  if ! { /usr/bin/python3 -m venv --system-site-packages "$PYTOOLS" &&
         "$PYTOOLS/bin/pip" install --quiet --disable-pip-version-check -r "$REQUIREMENTS"; }; then
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
