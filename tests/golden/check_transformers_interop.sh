#!/usr/bin/env bash
# Ember -> Hugging Face direction of the interop check (the other direction, transformers'
# checkpoints loaded by Ember, is tests/nn/test_bert_golden.cpp on the committed
# tests/golden/bert/ files): Ember trains both golden models three AdamW steps and saves them
# with save_pretrained, then transformers loads them with from_pretrained and must reproduce
# Ember's logits (make_bert_golden.py --verify).
#   bash tests/golden/check_transformers_interop.sh BUILD_DIR [PYTHON]
# PYTHON defaults to the project's tools environment (scripts/install_deps.sh), which sees
# Debian's PyTorch (python3-torch). Exits 77 (a skip for CTest) when that Python has no
# torch or transformers.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
build=$(realpath "$1")
python=${2:-${EMBER_PYTOOLS:-$HOME/.cache/ember-pytools}/bin/python}
if ! "$python" -c 'import torch, transformers, safetensors' 2>/dev/null; then
  echo "SKIP: $python cannot import torch, transformers and safetensors" \
       "(apt-get install python3-torch, then bash scripts/install_deps.sh)"
  exit 77
fi
out=$(mktemp -d "${TMPDIR:-/tmp}/ember_interop.XXXXXX")
trap 'rm -rf "$out"' EXIT
EMBER_BERT_EXPORT_DIR="$out" "$build/tests/test_bert_golden" --gtest_filter='*ExportForPythonVerify*' --gtest_brief=1
"$python" "$here/make_bert_golden.py" --verify "$out"
