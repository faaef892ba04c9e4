#!/usr/bin/env bash
# Ember -> Hugging Face direction of the interop check (the other direction, transformers'
# checkpoints loaded by Ember, is tests/nn/test_bert_golden.cpp on the committed
# tests/golden/bert/ files): Ember trains both golden models three AdamW steps and saves them
# with save_pretrained, then transformers loads them with from_pretrained and must reproduce
# Ember's logits (make_bert_golden.py --verify); the same for GPT-2 (test_gpt2_golden's export,
# make_gpt2_golden.py --verify) and ResNet (test_resnet_golden's export,
# make_resnet_golden.py --verify). Then two processes train the MLM model under FULL_SHARD
# through `ember launch --use_fsdp` and save_state a sharded checkpoint;
# `ember merge-weights` turns its shard files into one model.safetensors, which transformers
# must load and reproduce the sharded job's logits with.
#   bash tests/golden/check_transformers_interop.sh BUILD_DIR [PYTHON]
# PYTHON defaults to the project's tools environment (scripts/install_deps.sh), which sees
# Debian's PyTorch (python3-torch). Exits 77 (a skip for CTest) when that Python has no
# torch or transformers.
set -euo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
source "$here/../support/free_port.sh"
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
EMBER_GPT2_EXPORT_DIR="$out/gpt2" "$build/tests/test_gpt2_golden" --gtest_filter='*ExportForPythonVerify*' --gtest_brief=1
"$python" "$here/make_gpt2_golden.py" --verify "$out/gpt2"
EMBER_RESNET_EXPORT_DIR="$out/resnet" "$build/tests/test_resnet_golden" --gtest_filter='*ExportForPythonVerify*' --gtest_brief=1
"$python" "$here/make_resnet_golden.py" --verify "$out/resnet"
"$build/bin/ember" launch --num_processes 2 --main_process_port "$(free_port)" --use_fsdp --fsdp_sharding_strategy FULL_SHARD \
  --fsdp_transformer_layer_cls_to_wrap BertLayer \
  "$build/tests/programs/sharded_bert_export" "$here/bert" "$out/sharded"
test -f "$out/sharded/ckpt/model.shard-00001-of-00002.safetensors"
"$build/bin/ember" merge-weights "$out/sharded/ckpt" "$out/sharded/mlm"
"$python" "$here/make_bert_golden.py" --verify "$out/sharded" --kinds mlm
