#!/usr/bin/env bash
# Installs the PyTorch peer that Ember's CPU benchmarks compare against (bench/compare_bert_train.sh,
# bench/ddp_scaling.sh): PyTorch 2.15 from PyPI with numpy, in a virtual environment at
# $EMBER_PEER (default ~/.cache/ember-peer). About 2.5 GB: the PyPI wheel brings CUDA libraries it
# does not use on the CPU. Not needed by the build or the tests, so scripts/test.sh does not run it.
set -euo pipefail

PEER=${EMBER_PEER:-$HOME/.cache/ember-peer}
PEER_REQUIREMENTS=(torch==2.15.0 numpy)

if [[ -x "$PEER/bin/python" ]] && "$PEER/bin/python" -c 'import torch, numpy' 2>/dev/null; then
  echo "install_peer: $PEER has $("$PEER/bin/python" -c 'import torch; print("torch", torch.__version__)')"
  exit 0
fi
# python3-venv is in Ember's Debian package list.
bash "$(dirname "${BASH_SOURCE[0]}")/install_deps.sh"
echo "install_peer: ${PEER_REQUIREMENTS[*]} into $PEER"
rm -rf "$PEER"
/usr/bin/python3 -m venv "$PEER"
"$PEER/bin/pip" install --quiet --disable-pip-version-check "${PEER_REQUIREMENTS[@]}"
"$PEER/bin/python" -c 'import torch; print("install_peer: torch", torch.__version__)'
