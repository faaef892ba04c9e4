#!/usr/bin/env python3
"""PyTorch peer of bench/models_train: the Fashion-MNIST CNN and the byte-level GPT of the
examples, one training step timed at a time, in plain torch.nn.

  $PEER bench/models_train_peer.py --model cnn --dtype f32 --threads 2           # eager
  $PEER bench/models_train_peer.py --model gpt --dtype bf16 --threads 2 --sdpa --fused
  $PEER bench/models_train_peer.py --model cnn --dtype f32 --threads 2 --fused --compile --warmup 5
  python3 bench/models_train_peer.py --model gpt --device cuda --dtype bf16 --vocab 50257 --seq 1024 \
      --n-embd 768 --n-layer 12 --n-head 12 --batch 8 --sdpa --fused   # GPT-2 124M on a GPU

($PEER as in ../shared/peer/README.md: PyTorch 2.15 from PyPI with its allocator and OpenMP
settings.) The models are Ember's examples layer for layer:
  cnn  Conv(1->32, 3x3, pad 1) BN ReLU MaxPool2, Conv(32->64, 3x3, pad 1) BN ReLU MaxPool2,
       Flatten, Dropout 0.25, Linear(3136->128) ReLU, Dropout 0.25, Linear(128->10); batch 128
       of 28x28 images, cross-entropy, AdamW lr 1e-3.
  gpt  GPT-2 blocks (pre-LN, learned positions, causal attention, tanh GELU, tied head):
       vocab 257 (bytes + end of text), 4 layers, width 128, 4 heads, context 128, batch 32
       (examples/gpt_text.cpp's defaults; --n-embd/--n-layer/--n-head), next-token
       cross-entropy, AdamW lr 2e-3, weight decay 0.1.
bf16 is torch.autocast(device, torch.bfloat16) with f32 parameters and optimizer, as in Ember.
Prints JSON lines: {"kind": "meta", ...} then {"kind": "result", "median_step_ms": ...,
"items_per_s": ...} (images/s or tokens/s).
"""
import argparse
import json
import math
import os
import statistics
import sys
import time


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", choices=["cnn", "gpt"], required=True)
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--vocab", type=int, default=257, help="gpt vocabulary (257 bytes + end; 50257 for GPT-2's)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch", type=int, default=None, help="default: 128 images (cnn), 32 sequences (gpt)")
    p.add_argument("--seq", type=int, default=128, help="gpt context length")
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--sdpa", action="store_true", help="gpt attention through F.scaled_dot_product_attention")
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    a = p.parse_args(argv)
    if a.batch is None:
        a.batch = 128 if a.model == "cnn" else 32
    return a


def build_cnn(torch):
    nn = torch.nn
    return nn.Sequential(
        nn.Conv2d(1, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.25), nn.Linear(64 * 7 * 7, 128), nn.ReLU(), nn.Dropout(0.25),
        nn.Linear(128, 10))


def build_gpt(torch, a):
    vocab = a.vocab
    layers, width, heads = a.n_layer, a.n_embd, a.n_head
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(width, eps=1e-5)
            self.c_attn = nn.Linear(width, 3 * width)
            self.c_proj = nn.Linear(width, width)
            self.ln_2 = nn.LayerNorm(width, eps=1e-5)
            self.c_fc = nn.Linear(width, 4 * width)
            self.mlp_proj = nn.Linear(4 * width, width)
            self.drop = nn.Dropout(0.1)
            mask = torch.ones(a.seq, a.seq, dtype=torch.bool).tril()
            self.register_buffer("causal", mask, persistent=False)

        def attention(self, x):
            b, l, e = x.shape
            q, k, v = self.c_attn(x).split(width, dim=2)
            q, k, v = (t.view(b, l, heads, e // heads).transpose(1, 2) for t in (q, k, v))
            if a.sdpa:
                y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.1 if self.training else 0.0, is_causal=True)
            else:
                s = (q @ k.transpose(-2, -1)) / math.sqrt(e // heads)
                s = s.masked_fill(~self.causal[:l, :l], torch.finfo(s.dtype).min)
                y = self.drop(s.softmax(-1)) @ v
            return self.drop(self.c_proj(y.transpose(1, 2).reshape(b, l, e)))

        def forward(self, x):
            x = x + self.attention(self.ln_1(x))
            return x + self.drop(self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh")))

    class Gpt(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(vocab, width)
            self.wpe = nn.Embedding(a.seq, width)
            self.drop = nn.Dropout(0.1)
            self.h = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(width, eps=1e-5)

        def forward(self, ids):
            pos = torch.arange(ids.shape[1], device=ids.device)
            x = self.drop(self.wte(ids) + self.wpe(pos))
            for block in self.h:
                x = block(x)
            return self.ln_f(x) @ self.wte.weight.t()  # tied head

    gpt = Gpt()
    # GPT-2's initialisation: normal(0, 0.02), residual projections scaled by 1/sqrt(2 * layers).
    for name, p in gpt.named_parameters():
        if name.endswith("weight") and p.dim() == 2:
            std = 0.02 / math.sqrt(2 * layers) if ("c_proj" in name or "mlp_proj" in name) else 0.02
            torch.nn.init.normal_(p, 0.0, std)
        elif name.endswith("bias"):
            torch.nn.init.zeros_(p)
    return gpt


def main():
    a = parse_args()
    for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[k] = str(a.threads)
    import torch
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    F = torch.nn.functional
    if a.model == "cnn":
        model = build_cnn(torch)
        inputs = [(torch.randn(a.batch, 1, 28, 28, device=a.device), torch.randint(0, 10, (a.batch,), device=a.device))
                  for _ in range(4)]
        loss_of = lambda m, x, y: F.cross_entropy(m(x), y)
        opt_args = dict(lr=1e-3, weight_decay=0.01)
        items = a.batch
    else:
        model = build_gpt(torch, a)
        inputs = []
        for _ in range(4):
            ids = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device=a.device)
            inputs.append((ids[:, :-1].contiguous(), ids[:, 1:].contiguous()))
        loss_of = lambda m, x, y: F.cross_entropy(m(x).float().view(-1, a.vocab), y.view(-1))
        opt_args = dict(lr=2e-3, weight_decay=0.1)
        items = a.batch * a.seq
    model.to(a.device)
    model.train()
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), fused=True, **opt_args) if a.fused else \
        torch.optim.AdamW(model.parameters(), **opt_args)
    step_model = torch.compile(model) if a.compile else model
    print(json.dumps(dict(kind="meta", script="models_train_peer.py", argv=sys.argv[1:], torch=torch.__version__,
                          threads=torch.get_num_threads(), params=params)), flush=True)
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        x, y = inputs[i % len(inputs)]
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        with torch.autocast(a.device, dtype=torch.bfloat16, enabled=a.dtype == "bf16"):
            loss = loss_of(step_model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())  # waits for the device, so the step is timed whole
        t1 = time.perf_counter()
        if i >= a.warmup:
            times.append(t1 - t0)
    med = statistics.median(times)
    mode = "compile" if a.compile else ("sdpa" if a.sdpa or a.fused else "eager")
    print(json.dumps(dict(kind="result", model=a.model, device=a.device, dtype=a.dtype, mode=mode, threads=a.threads, batch=a.batch,
                          median_step_ms=round(med * 1e3, 3), min_step_ms=round(min(times) * 1e3, 3),
                          items_per_s=round(items / med, 1), first_loss=round(losses[0], 4),
                          last_loss=round(losses[-1], 4), params=params)), flush=True)


if __name__ == "__main__":
    main()
