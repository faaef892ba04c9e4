#!/usr/bin/python3
"""Golden files for Ember's ResNet (tests/nn/test_resnet_golden.cpp), made with PyTorch and Hugging
Face transformers' ResNetForImageClassification, and a check that Ember's checkpoints load there.

Run with the tools Python (~/.cache/ember-pytools/bin/python: Debian's torch 1.13 and transformers
4.45.2, see tests/golden/README.md):

  ~/.cache/ember-pytools/bin/python tests/golden/make_resnet_golden.py               # rewrites tests/golden/resnet/
  ~/.cache/ember-pytools/bin/python tests/golden/make_resnet_golden.py --verify DIR

Writing mode builds two small ResNets from fixed seeds, one of basic blocks (3 input channels,
stem 8, stages of 8 and 12 channels, depths 1 and 2, 5 labels) and one of bottleneck blocks (stem
8, stages 16 and 32, 4 labels), perturbs the batch-norm weights, biases and running statistics so
that none is trivially 0 or 1, and saves each with save_pretrained in resnet/<kind>/. On a batch of
three 20x20 images it records in resnet/expected_<kind>.safetensors:
  pixel_values, labels                    the batch
  logits, loss                            the forward pass in train mode (batch statistics)
  grad.<parameter name>                   every parameter's gradient of that loss
  after_forward.<buffer name>             running statistics after that one training forward
  adamw_losses                            the loss before each of three AdamW steps
  adamw.<name>                            every parameter and buffer after them (lr 1e-3,
                                          weight_decay 0.01, eps 1e-3; the buffers after four forwards)
  eval_logits                             the stepped model's logits in eval mode (running stats)
The computation is repeated in float64 and every float32 value must agree to 1e-5 of the tensor's
largest magnitude before anything is written.

--verify DIR loads DIR/<kind> (config.json + model.safetensors written by Ember's save_pretrained,
and ember_outputs.safetensors with Ember's eval-mode logits) into transformers, requires that no
weight is missing or unexpected, and compares the logits.
"""
import argparse
import copy
import os
import sys

import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import ResNetConfig, ResNetForImageClassification

HERE = os.path.dirname(os.path.abspath(__file__))
OUT_DIR = os.path.join(HERE, "resnet")
# eps 1e-3 rather than 1e-8: a batch-norm layer in train mode removes any per-channel constant
# from its input, so a bias whose channel stays on the linear side of every ReLU up to the next
# batch norm has a gradient that is exactly zero in theory and rounding noise in practice;
# with a tiny eps, Adam would turn that noise into full-size steps of random sign.
ADAMW = dict(lr=1e-3, weight_decay=0.01, eps=1e-3)
ADAMW_STEPS = 3
CONDITIONING_TOL = 1e-5
IMAGE = 20

CONFIGS = {
    "basic": dict(num_channels=3, embedding_size=8, hidden_sizes=[8, 12], depths=[1, 2], layer_type="basic",
                  num_labels=5),
    "bottleneck": dict(num_channels=3, embedding_size=8, hidden_sizes=[16, 32], depths=[1, 1],
                       layer_type="bottleneck", num_labels=4),
}


def make_model(kind, seed):
    torch.manual_seed(seed)
    model = ResNetForImageClassification(ResNetConfig(**CONFIGS[kind]))
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if "normalization.weight" in name:
                t.add_(0.2 * torch.randn(t.shape, generator=gen))
            elif name.endswith("bias"):
                t.add_(0.1 * torch.randn(t.shape, generator=gen))
            elif name.endswith("running_mean"):
                t.add_(0.1 * torch.randn(t.shape, generator=gen))
            elif name.endswith("running_var"):
                t.mul_(1 + 0.3 * torch.rand(t.shape, generator=gen))
    return model


def make_batch(kind):
    gen = torch.Generator().manual_seed(11)
    pixels = torch.randn(3, 3, IMAGE, IMAGE, generator=gen)
    labels = torch.randint(0, CONFIGS[kind]["num_labels"], (3,), generator=gen)
    return pixels, labels


def run(model, pixels, labels, dtype):
    model = copy.deepcopy(model).to(dtype)
    model.train()
    out = model(pixel_values=pixels.to(dtype), labels=labels)
    out.loss.backward()
    rec = {"logits": out.logits.detach().clone(), "loss": out.loss.detach().clone()}
    for name, p in model.named_parameters():
        rec["grad." + name] = p.grad.detach().clone()
    for name, b in model.named_buffers():
        if b.is_floating_point():
            rec["after_forward." + name] = b.detach().clone()
    opt = torch.optim.AdamW(model.parameters(), **ADAMW)
    losses = []
    for _ in range(ADAMW_STEPS):
        opt.zero_grad()
        loss = model(pixel_values=pixels.to(dtype), labels=labels).loss
        losses.append(loss.detach().clone())
        loss.backward()
        opt.step()
    rec["adamw_losses"] = torch.stack(losses)
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.is_floating_point():
            rec["adamw." + name] = t.detach().clone()
    model.eval()
    with torch.no_grad():
        rec["eval_logits"] = model(pixel_values=pixels.to(dtype)).logits.clone()
    return rec


def check_conditioning(kind, rec32, rec64):
    worst = 0.0
    for key, v32 in rec32.items():
        v64 = rec64[key]
        scale = v64.abs().max().item()
        err = (v32.double() - v64).abs().max().item() / (scale if scale > 0 else 1.0)
        worst = max(worst, err)
        assert err <= CONDITIONING_TOL, f"{kind}: {key} differs between float32 and float64 by {err:.2e}"
    print(f"{kind}: float32 vs float64 worst relative difference {worst:.2e}")


def make_golden():
    os.makedirs(OUT_DIR, exist_ok=True)
    for seed, kind in enumerate(CONFIGS, start=100):
        model = make_model(kind, seed)
        model.save_pretrained(os.path.join(OUT_DIR, kind), safe_serialization=True)
        pixels, labels = make_batch(kind)
        rec32 = run(model, pixels, labels, torch.float32)
        rec64 = run(model, pixels, labels, torch.float64)
        check_conditioning(kind, rec32, rec64)
        tensors = dict(pixel_values=pixels, labels=labels)
        tensors.update({k: v.contiguous() for k, v in rec32.items()})
        save_file(tensors, os.path.join(OUT_DIR, f"expected_{kind}.safetensors"),
                  metadata={"torch": torch.__version__, "transformers": transformers.__version__})
        print(f"{kind}: loss {rec32['loss'].item():.6f}, {len(tensors)} tensors")
    total = sum(os.path.getsize(os.path.join(root, f)) for root, _, files in os.walk(OUT_DIR) for f in files)
    print(f"wrote {OUT_DIR} ({total / 1024:.0f} KiB)")


def verify(directory):
    ok = True
    for kind in CONFIGS:
        path = os.path.join(directory, kind)
        if not os.path.isdir(path):
            continue
        model, info = ResNetForImageClassification.from_pretrained(path, output_loading_info=True)
        bad = {k: v for k, v in info.items() if v}
        if bad:
            print(f"{kind}: loading problems {bad}")
            ok = False
        expected = load_file(os.path.join(path, "ember_outputs.safetensors"))
        model.eval()
        with torch.no_grad():
            logits = model(pixel_values=expected["pixel_values"]).logits
        ref = expected["logits"]
        err = (logits - ref).abs().max().item() / ref.abs().max().item()
        print(f"{kind}: transformers vs Ember logits, max |diff| / max |ref| = {err:.2e}")
        if err > 1e-5:
            ok = False
    print("OK" if ok else "FAILED")
    return 0 if ok else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verify", metavar="DIR")
    args = parser.parse_args()
    if args.verify:
        sys.exit(verify(args.verify))
    make_golden()


if __name__ == "__main__":
    main()
