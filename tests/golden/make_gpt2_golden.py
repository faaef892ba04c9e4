#!/usr/bin/python3
"""Golden files for Ember's GPT-2 (tests/nn/test_gpt2_golden.cpp), made with PyTorch and Hugging Face
transformers, and a check that checkpoints written by Ember load in transformers.

Produced with the project's tools Python (~/.cache/ember-pytools/bin/python: torch 1.13, transformers
4.45.2, safetensors). No network access is needed: the model is built from a config, not downloaded.

  ~/.cache/ember-pytools/bin/python tests/golden/make_gpt2_golden.py              # rewrites tests/golden/gpt2/
  ~/.cache/ember-pytools/bin/python tests/golden/make_gpt2_golden.py --verify DIR

Writing mode builds a tiny GPT2LMHeadModel (vocab 96, 16 positions, n_embd 16, 2 layers, 2 heads,
n_inner null = 64, gelu_new, no dropout, eager attention) from a fixed seed, perturbs the biases and
LayerNorm parameters so that none is trivially 0 or 1, and saves it with save_pretrained into gpt2/
(config.json + model.safetensors; the tied lm_head is not stored). On a right-padded batch (rows of
10, 7 and 4 real tokens; labels are the input ids with -100 at the padding and at one more position
per row) it records in expected_gpt2.safetensors:
  input_ids, attention_mask, labels    the batch (int64)
  logits, loss                         the forward pass in train mode (dropout is 0); the loss is the
                                       shifted next-token cross-entropy transformers computes
  grad.<parameter name>                every parameter's gradient of that loss
  adamw_losses                         the loss before each of three AdamW steps
  adamw.<parameter name>               selected parameters after those three steps
                                       (torch.optim.AdamW, lr 1e-3, weight_decay 0.01)
Before writing, the whole computation is repeated in float64 and every recorded float32 value must
agree with it to 1e-5 of the tensor's largest magnitude, so the C++ tolerance measures Ember and not
float32 rounding. The gradient of the c_attn bias's key third is mathematically zero (softmax ignores
a shift shared by every key) and is recorded as the rounding noise it is.

--verify DIR loads the checkpoint Ember wrote with
  EMBER_GPT2_EXPORT_DIR=DIR ./test_gpt2_golden --gtest_filter='*ExportForPythonVerify*'
(DIR/config.json + model.safetensors + ember_outputs.safetensors holding the batch and Ember's
logits) into transformers, requires that no weight is missing or unexpected, that lm_head is tied to
wte, and that the logits transformers computes equal Ember's.
"""
import argparse
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import GPT2Config, GPT2LMHeadModel

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from make_bert_golden import ADAMW, ADAMW_STEPS, run  # noqa: E402  (forward, backward, AdamW steps)
OUT_DIR = os.path.join(HERE, "gpt2")
EXPECTED = os.path.join(HERE, "expected_gpt2.safetensors")

VOCAB = 96
LENGTHS = [10, 7, 4]
SEQ_LEN = 10
ADAMW_RECORDED = ["transformer.wte.weight",
                  "transformer.wpe.weight",
                  "transformer.h.0.attn.c_attn.weight",
                  "transformer.h.1.mlp.c_proj.weight",
                  "transformer.h.1.ln_2.bias",
                  "transformer.ln_f.weight"]
CONDITIONING_TOL = 1e-5


def small_config():
    return GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=16, n_layer=2, n_head=2, n_inner=None,
                      activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                      layer_norm_epsilon=1e-5, initializer_range=0.1, bos_token_id=VOCAB - 1,
                      eos_token_id=VOCAB - 1, attn_implementation="eager")


def make_model():
    torch.manual_seed(1234)
    model = GPT2LMHeadModel(small_config())
    gen = torch.Generator().manual_seed(42)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
    return model


def make_batch():
    gen = torch.Generator().manual_seed(7)
    batch = len(LENGTHS)
    input_ids = torch.zeros(batch, SEQ_LEN, dtype=torch.int64)
    attention_mask = torch.zeros(batch, SEQ_LEN, dtype=torch.int64)
    labels = torch.full((batch, SEQ_LEN), -100, dtype=torch.int64)
    for row, n in enumerate(LENGTHS):
        input_ids[row, :n] = torch.randint(0, VOCAB, (n,), generator=gen)
        input_ids[row, n:] = VOCAB - 1  # padding with the eos token, as GPT-2 users do
        attention_mask[row, :n] = 1
        labels[row, :n] = input_ids[row, :n]
        labels[row, int(torch.randint(1, n, (1,), generator=gen))] = -100
    return dict(input_ids=input_ids, attention_mask=attention_mask), labels


def key_bias_noise(key):
    return key.startswith("grad.") and key.endswith("attn.c_attn.bias")


def check_conditioning(rec32, rec64):
    worst = 0.0
    for key, v32 in rec32.items():
        v64 = rec64[key]
        if key_bias_noise(key):
            # the key third is rounding noise; the query and value thirds are real
            e = v64.shape[0] // 3
            v32 = torch.cat([v32[:e], v32[2 * e:]])
            v64 = torch.cat([v64[:e], v64[2 * e:]])
        scale = v64.abs().max().item()
        err = (v32.double() - v64).abs().max().item() / (scale if scale > 0 else 1.0)
        worst = max(worst, err)
        assert err <= CONDITIONING_TOL, f"{key} differs between float32 and float64 by {err:.2e}"
    print(f"float32 vs float64 worst relative difference {worst:.2e}")


def make_golden():
    os.makedirs(OUT_DIR, exist_ok=True)
    model = make_model()
    inputs, labels = make_batch()
    model.save_pretrained(OUT_DIR, safe_serialization=True)
    generation_config = os.path.join(OUT_DIR, "generation_config.json")
    if os.path.exists(generation_config):
        os.remove(generation_config)  # Ember reads config.json only
    rec32, params32 = run(model, inputs, labels, torch.float32)
    rec64, params64 = run(model, inputs, labels, torch.float64)
    for name in ADAMW_RECORDED:
        rec32["adamw." + name] = params32[name].detach().clone()
        rec64["adamw." + name] = params64[name].detach().clone()
    check_conditioning(rec32, rec64)
    tensors = dict(inputs, labels=labels)
    tensors.update({k: v.contiguous() for k, v in rec32.items()})
    save_file(tensors, EXPECTED, metadata={"torch": torch.__version__, "transformers": transformers.__version__})
    print(f"loss {rec32['loss'].item():.6f}, {len(tensors)} tensors")
    total = sum(os.path.getsize(os.path.join(OUT_DIR, f)) for f in os.listdir(OUT_DIR)) + os.path.getsize(EXPECTED)
    print(f"wrote {OUT_DIR} and {EXPECTED} ({total / 1024:.0f} KiB)")


def verify(directory):
    ok = True
    model, info = GPT2LMHeadModel.from_pretrained(directory, output_loading_info=True, attn_implementation="eager")
    bad = {k: [x for x in v if x != "lm_head.weight"] for k, v in info.items()}
    bad = {k: v for k, v in bad.items() if v}
    if bad:
        print(f"loading problems {bad}")
        ok = False
    if model.lm_head.weight.data_ptr() != model.transformer.wte.weight.data_ptr():
        print("lm_head is not tied to wte")
        ok = False
    expected = load_file(os.path.join(directory, "ember_outputs.safetensors"))
    model.eval()
    with torch.no_grad():
        logits = model(input_ids=expected["input_ids"], attention_mask=expected["attention_mask"]).logits
    ref = expected["logits"]
    err = (logits - ref).abs().max().item() / ref.abs().max().item()
    print(f"transformers vs Ember logits, max |diff| / max |ref| = {err:.2e}")
    if not err <= 1e-4:
        ok = False
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main():
    transformers.logging.set_verbosity_error()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verify", metavar="DIR", help="check the checkpoint written by Ember in DIR")
    args = parser.parse_args()
    if args.verify:
        sys.exit(verify(args.verify))
    make_golden()


if __name__ == "__main__":
    main()
