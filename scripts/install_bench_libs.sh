#!/usr/bin/env bash
# Installs the GEMM libraries that bench/bench_gemm_libs.cpp compares Ember's packed GEMM against
# (bench/compare_gemm_libs.sh): Intel MKL and a current oneDNN from PyPI, pinned, in a virtual
# environment at $EMBER_BENCH_LIBS (default ~/.cache/ember-bench-libs). The wheels carry the
# shared libraries and headers (about 2.7 GB with the SYCL and OpenCL runtimes that onednn pulls
# in); nothing is built. Not needed by the build or the tests (CMake looks for them only when
# configured with -DEMBER_BENCH_LIBS_DIR), so scripts/test.sh does not run it. Prints the
# directory to pass to CMake.
set -euo pipefail

LIBS=${EMBER_BENCH_LIBS:-$HOME/.cache/ember-bench-libs}
BENCH_LIBS_REQUIREMENTS=(mkl-devel==2026.2.0 mkl-include==2026.2.0 onednn==2026.1.0 onednn-devel==2026.1.0)

# Written after a complete install: the pins it installed, one a line.
STAMP="$LIBS/ember-bench-libs.pins"
installed() {
  [[ -x "$LIBS/bin/python" && -r $STAMP ]] && [[ $(cat "$STAMP") == "$(printf '%s\n' "${BENCH_LIBS_REQUIREMENTS[@]}")" ]]
}

if ! installed; then
  # python3-venv is in Ember's Debian package list.
  bash "$(dirname "${BASH_SOURCE[0]}")/install_deps.sh"
  echo "install_bench_libs: ${BENCH_LIBS_REQUIREMENTS[*]} into $LIBS"
  rm -rf "$LIBS"
  /usr/bin/python3 -m venv "$LIBS"
  "$LIBS/bin/pip" install --quiet --disable-pip-version-check "${BENCH_LIBS_REQUIREMENTS[@]}"
  printf '%s\n' "${BENCH_LIBS_REQUIREMENTS[@]}" >"$STAMP"
fi
echo "install_bench_libs: $LIBS"
