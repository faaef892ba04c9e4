#!/usr/bin/python3
"""Golden files for Ember's BERT (tests/nn/test_bert_golden.cpp), made with PyTorch and Hugging Face
transformers, and a check that checkpoints written by Ember load in transformers.

Produced with Debian's /usr/bin/python3 (3.11.2), torch 1.13.0a0 (Debian python3-torch 1.13.1+dfsg-4),
transformers 4.45.2 and safetensors 0.8.0 (pip). See tests/golden/README.md.

  /usr/bin/python3 tests/golden/make_bert_golden.py              # rewrites tests/golden/bert/
  /usr/bin/python3 tests/golden/make_bert_golden.py --verify DIR

Writing mode builds a small BERT (vocab 512, hidden 32, 2 layers, 4 heads, FFN 64, no dropout)
from a fixed seed, perturbs the biases and LayerNorm parameters so that none is trivially 0 or 1,
and saves it twice with save_pretrained: bert/mlm/ (BertForMaskedLM) and bert/cls/
(BertForSequenceClassification, 2 labels, the same encoder weights plus a pooler and classifier).
On a padded batch (rows of 12, 9 and 5 real tokens) it records in bert/expected_{mlm,cls}.safetensors:
  input_ids, attention_mask, token_type_ids, labels   the batch (int64)
  logits, loss                                      the forward pass in train mode (dropout is 0)
  grad.<parameter name>                             every parameter's gradient of that loss
  adamw_losses                                      the loss before each of three AdamW steps
  adamw.<parameter name>                            selected parameters after those three steps
                                                    (torch.optim.AdamW, lr 1e-3, weight_decay 0.01)
Before writing, the whole computation is repeated in float64 and every recorded float32 value must
agree with it to 1e-5 of the tensor's largest magnitude, so a 1e-4 tolerance in the C++ test
measures Ember and not float32 rounding. Gradients of the attention key biases are mathematically
zero (softmax ignores a shift shared by every key) and are recorded as the rounding noise they are;
the C++ test only checks that they are tiny.

--verify DIR loads the checkpoints Ember wrote with
  EMBER_BERT_EXPORT_DIR=DIR ./test_bert_golden
(DIR/mlm and DIR/cls, each config.json + model.safetensors + ember_outputs.safetensors holding the
batch and Ember's logits) into transformers, requires that no weight is missing or unexpected apart
from the tied decoder, and compares the logits transformers computes with Ember's. --kinds mlm
checks DIR/mlm alone (the sharded export, whose model.safetensors `ember merge-weights` wrote).
"""
import argparse
import copy
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertForMaskedLM, BertForSequenceClassification

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "bert")

LENGTHS = [12, 9, 5]
SEQ_LEN = 12
ADAMW = dict(lr=1e-3, weight_decay=0.01)
ADAMW_STEPS = 3
# Parameters whose values after the AdamW steps are recorded (the word embeddings are tied to
# the MLM decoder).
ADAMW_RECORDED = {
    "mlm": ["bert.embeddings.word_embeddings.weight",
            "bert.embeddings.position_embeddings.weight",
            "bert.encoder.layer.0.attention.self.query.weight",
            "bert.encoder.layer.1.output.LayerNorm.weight",
            "cls.predictions.transform.dense.weight",
            "cls.predictions.bias"],
    "cls": ["bert.embeddings.token_type_embeddings.weight",
            "bert.encoder.layer.1.attention.self.query.weight",
            "bert.encoder.layer.0.intermediate.dense.bias",
            "bert.pooler.dense.weight",
            "classifier.weight",
            "classifier.bias"],
}
CONDITIONING_TOL = 1e-5


def small_config(**extra):
    return BertConfig(vocab_size=512, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                      intermediate_size=64, max_position_embeddings=64, type_vocab_size=2,
                      hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, layer_norm_eps=1e-12,
                      hidden_act="gelu", initializer_range=0.1, pad_token_id=0, **extra)


def make_models():
    torch.manual_seed(1234)
    mlm = BertForMaskedLM(small_config())
    torch.manual_seed(5678)
    cls = BertForSequenceClassification(small_config(num_labels=2))
    gen = torch.Generator().manual_seed(42)
    with torch.no_grad():
        for name, p in mlm.named_parameters():
            if "LayerNorm.weight" in name:
                p.add_(0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith("bias"):
                p.add_(0.05 * torch.randn(p.shape, generator=gen))
        for name, p in cls.named_parameters():
            if name.startswith("bert.pooler") or name.startswith("classifier"):
                if name.endswith("bias"):
                    p.add_(0.05 * torch.randn(p.shape, generator=gen))
        missing, unexpected = cls.bert.load_state_dict(mlm.bert.state_dict(), strict=False)
        assert missing == ["pooler.dense.weight", "pooler.dense.bias"] and not unexpected, (missing, unexpected)
    return mlm, cls


def make_batch():
    gen = torch.Generator().manual_seed(7)
    batch, length = len(LENGTHS), SEQ_LEN
    input_ids = torch.zeros(batch, length, dtype=torch.int64)
    attention_mask = torch.zeros(batch, length, dtype=torch.int64)
    token_type_ids = torch.zeros(batch, length, dtype=torch.int64)
    mlm_labels = torch.full((batch, length), -100, dtype=torch.int64)
    for row, n in enumerate(LENGTHS):
        input_ids[row, :n] = torch.randint(1, 512, (n,), generator=gen)
        attention_mask[row, :n] = 1
        token_type_ids[row, n // 2:n] = 1  # a second segment in the back half of the real tokens
        scored = torch.randperm(n, generator=gen)[:min(4, n - 2)]
        mlm_labels[row, scored] = torch.randint(1, 512, (len(scored),), generator=gen)
    cls_labels = torch.tensor([1, 0, 1], dtype=torch.int64)
    return dict(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids), \
        mlm_labels, cls_labels


def run(model, inputs, labels, dtype):
    """Forward/backward, then AdamW steps; returns every value the golden file records."""
    model = copy.deepcopy(model).to(dtype)
    model.train()
    out = model(**inputs, labels=labels)
    out.loss.backward()
    rec = {"logits": out.logits.detach().clone(), "loss": out.loss.detach().clone()}
    for name, p in model.named_parameters():
        rec["grad." + name] = p.grad.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad()
        loss = model(**inputs, labels=labels).loss
        losses.append(loss.detach().clone())
        loss.backward()
        opt.step()
    rec["adamw_losses"] = torch.stack(losses)
    return rec, dict(model.named_parameters())


def check_conditioning(kind, rec32, rec64):
    worst = 0.0
    for key, v32 in rec32.items():
        if ".attention.self.key.bias" in key:
            continue
        v64 = rec64[key]
        scale = v64.abs().max().item()
        err = (v32.double() - v64).abs().max().item() / (scale if scale > 0 else 1.0)
        worst = max(worst, err)
        assert err <= CONDITIONING_TOL, f"{kind}: {key} differs between float32 and float64 by {err:.2e}"
    print(f"{kind}: float32 vs float64 worst relative difference {worst:.2e}")


def make_golden():
    os.makedirs(OUT_DIR, exist_ok=True)
    mlm, cls = make_models()
    inputs, mlm_labels, cls_labels = make_batch()
    for kind, model, labels in [("mlm", mlm, mlm_labels), ("cls", cls, cls_labels)]:
        model.save_pretrained(os.path.join(OUT_DIR, kind), safe_serialization=True)
        generation_config = os.path.join(OUT_DIR, kind, "generation_config.json")
        if os.path.exists(generation_config):
            os.remove(generation_config)  # written for every model with a generate(); BERT has no use for it
        rec32, params32 = run(model, inputs, labels, torch.float32)
        rec64, params64 = run(model, inputs, labels, torch.float64)
        for name in ADAMW_RECORDED[kind]:
            rec32["adamw." + name] = params32[name].detach().clone()
            rec64["adamw." + name] = params64[name].detach().clone()
        check_conditioning(kind, rec32, rec64)
        tensors = dict(inputs, labels=labels)
        tensors.update({k: v.contiguous() for k, v in rec32.items()})
        save_file(tensors, os.path.join(OUT_DIR, f"expected_{kind}.safetensors"),
                  metadata={"torch": torch.__version__, "transformers": transformers.__version__})
        print(f"{kind}: loss {rec32['loss'].item():.6f}, {len(tensors)} tensors")
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(OUT_DIR) for f in files)
    print(f"wrote {OUT_DIR} ({total / 1024:.0f} KiB)")


def verify(directory, kinds):
    ok = True
    for kind, cls_type in [("mlm", BertForMaskedLM), ("cls", BertForSequenceClassification)]:
        if kind not in kinds:
            continue
        path = os.path.join(directory, kind)
        model, info = cls_type.from_pretrained(path, output_loading_info=True)
        tied = {"cls.predictions.decoder.weight", "cls.predictions.decoder.bias"}
        bad = {k: [x for x in v if x not in tied] for k, v in info.items()}
        bad = {k: v for k, v in bad.items() if v}
        if bad:
            print(f"{kind}: loading problems {bad}")
            ok = False
        if kind == "mlm":
            same = model.cls.predictions.decoder.weight.data_ptr() == model.bert.embeddings.word_embeddings.weight.data_ptr()
            if not same:
                print(f"{kind}: decoder weight is not tied to the word embeddings")
                ok = False
        expected = load_file(os.path.join(path, "ember_outputs.safetensors"))
        model.eval()
        with torch.no_grad():
            logits = model(input_ids=expected["input_ids"], attention_mask=expected["attention_mask"],
                           token_type_ids=expected["token_type_ids"]).logits
        ref = expected["logits"]
        err = (logits - ref).abs().max().item() / ref.abs().max().item()
        print(f"{kind}: transformers vs Ember logits, max |diff| / max |ref| = {err:.2e}")
        if not err <= 1e-4:
            ok = False
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main():
    transformers.logging.set_verbosity_error()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--verify", metavar="DIR", help="check checkpoints written by Ember in DIR")
    parser.add_argument("--kinds", default="mlm,cls", help="with --verify: the subdirectories to check")
    args = parser.parse_args()
    if args.verify:
        sys.exit(verify(args.verify, args.kinds.split(",")))
    make_golden()


if __name__ == "__main__":
    main()
