#!/usr/bin/env python3
"""BERT training-step benchmark in plain PyTorch: the peer of bench/bert_train.

Trains the model bert_train trains, on the batches bert_train feeds it, and prints one JSON
line in the same shape, so bench/compare_bert_train.sh can set the two side by side.

  bert_train_peer.py --config bert-mini --task mlm --threads 2 --batch 16 --seq 128 --warmup 3 --steps 10

Model (the layout of Ember's nn::BertForMaskedLM / nn::BertForSequenceClassification):
token + position + segment embeddings -> LayerNorm -> dropout; N post-LN encoder layers
(multi-head self-attention with an additive mask, exact-erf GELU feed-forward, dropout 0.1);
then either the MLM head (dense -> GELU -> LayerNorm -> decoder over the full vocabulary,
weight tied to the token embedding, own bias; every position is decoded and the unscored
ones carry label -100) or the classification head (tanh pooler on the first token ->
dropout -> linear). AdamW, lr 1e-4, weight decay 0.01 on every parameter.

Batches: random token ids in [1, vocab), attention mask of ones, segment 0, 15% of MLM
positions scored (label = the token, -100 elsewhere) or random labels in {0, 1}.

--dtype bf16 runs the forward under torch.autocast(<device>, bfloat16); parameters and the
optimizer stay float32.

The modes of the shared peer (shared/peer/bert_ref.py), for the CPU: --sdpa (attention through
F.scaled_dot_product_attention), --fused (AdamW(fused=True)), --compile (torch.compile, inductor).
The JSON line names them in "mode" ("eager" without any).

--device cuda (bench/bert_train --device cuda's peer): the model and each batch on cuda:0
(batches drawn on the CPU as above, then copied, untimed), eager mode, AdamW with fused=True
where this torch has it (>= 2.0), else foreach=True; torch.cuda.synchronize() before each
clock reading. The JSON line adds "device", "mfu" (the same FLOP count over --peak-tflops, the
GPU's dense bf16 peak, default 989 for an H100/H200 SXM), "peak_gpu_mb"
(torch.cuda.max_memory_allocated) and "optimizer"; peak_rss_mb is left out there.

  bert_train_peer.py --device cuda --config bert-base --task mlm --dtype bf16 --batch 64 --seq 128

Run it the way the comparison runs it (settings for PyTorch only, see README_bert.md):
  env -u OPENBLAS_CORETYPE GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736 \\
      OMP_WAIT_POLICY=PASSIVE /usr/bin/python3 bench/bert_train_peer.py ...
"""
import argparse
import json
import math
import os
import resource
import statistics
import sys
import time

PRESETS = {
    "bert-mini": dict(layers=4, hidden=256, heads=4, ffn=1024),
    "bert-tiny": dict(layers=2, hidden=128, heads=2, ffn=512),
    "bert-base": dict(layers=12, hidden=768, heads=12, ffn=3072),
}


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", choices=sorted(PRESETS), default=None,
                   help="layers/hidden/heads/ffn preset (default bert-mini); explicit flags win")
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--ffn", type=int)
    p.add_argument("--vocab", type=int, default=30522)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--task", choices=["mlm", "cls"], default="mlm")
    p.add_argument("--dtype", choices=["f32", "bf16"], default="f32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--peak-tflops", type=float, default=989.0,
                   help="CUDA only: the GPU's dense bf16 peak, the MFU denominator (989: H100/H200 SXM)")
    # The modes of the shared peer (shared/peer/bert_ref.py); compare_bert_train.sh takes the fastest.
    p.add_argument("--sdpa", action="store_true", help="attention through F.scaled_dot_product_attention")
    p.add_argument("--fused", action="store_true", help="AdamW(fused=True) on the CPU too")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (inductor)")
    a = p.parse_args(argv)
    for key, value in PRESETS[a.config or "bert-mini"].items():
        if getattr(a, key) is None:
            setattr(a, key, value)
    if a.hidden % a.heads != 0:
        p.error(f"--hidden {a.hidden} is not divisible by --heads {a.heads}")
    if a.steps <= 0 or a.warmup < 0 or a.threads <= 0:
        p.error("--steps and --threads must be positive, --warmup non-negative")
    if a.vocab <= 1 or a.seq <= 0 or a.batch <= 0:
        p.error("--vocab must exceed 1, --seq and --batch must be positive")
    if a.peak_tflops <= 0:
        p.error("--peak-tflops must be positive")
    return a


def pin_thread_pools(n):
    # Debian's torch calls the system libblas.so.3 (OpenBLAS), whose pool is sized when the
    # library loads and ignores torch.set_num_threads: the variables must be set before import.
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)


def step_flops(a):
    # The count bench/bert_train.cpp uses: GEMM and attention multiply-adds, backward = 2x forward,
    # except the masked-LM decoder's, counted over the 15% of rows that are scored.
    t, h, f, s = a.batch * a.seq, a.hidden, a.ffn, a.seq
    encoder = a.layers * (2 * t * (4 * h * h + 2 * h * f) + 4 * t * s * h)
    if a.task != "mlm":
        return 3.0 * (encoder + 2 * a.batch * (h * h + 2 * h))
    decoder = 2 * t * h * a.vocab
    return 3.0 * (encoder + 2 * t * h * h) + decoder * (1 + 2 * 0.15)


def build_model(a):
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    max_positions = max(512, a.seq)

    class Embeddings(nn.Module):
        def __init__(self):
            super().__init__()
            self.word = nn.Embedding(a.vocab, a.hidden)
            self.position = nn.Embedding(max_positions, a.hidden)
            self.segment = nn.Embedding(2, a.hidden)
            self.norm = nn.LayerNorm(a.hidden, eps=1e-12)
            self.drop = nn.Dropout(0.1)

        def forward(self, ids, segments):
            positions = torch.arange(ids.shape[1], device=ids.device).unsqueeze(0)
            return self.drop(self.norm(self.word(ids) + self.position(positions) + self.segment(segments)))

    class SelfAttention(nn.Module):
        # Q, K and V come from one [3H, H] projection: the same products as three separate
        # linears, in the GEMM shape PyTorch runs fastest.
        def __init__(self):
            super().__init__()
            self.heads, self.head_dim = a.heads, a.hidden // a.heads
            self.qkv = nn.Linear(a.hidden, 3 * a.hidden)
            self.drop = nn.Dropout(0.1)

        def forward(self, x, additive_mask):
            b, s, h = x.shape
            q, k, v = self.qkv(x).view(b, s, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
            if a.sdpa:
                context = F.scaled_dot_product_attention(q, k, v, attn_mask=additive_mask.to(q.dtype),
                                                         dropout_p=0.1 if self.training else 0.0)
                return context.transpose(1, 2).reshape(b, s, h)
            scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim) + additive_mask
            probs = self.drop(torch.softmax(scores, dim=-1))
            return torch.matmul(probs, v).transpose(1, 2).reshape(b, s, h)

    class EncoderLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = SelfAttention()
            self.attention_out = nn.Linear(a.hidden, a.hidden)
            self.attention_norm = nn.LayerNorm(a.hidden, eps=1e-12)
            self.intermediate = nn.Linear(a.hidden, a.ffn)
            self.output = nn.Linear(a.ffn, a.hidden)
            self.output_norm = nn.LayerNorm(a.hidden, eps=1e-12)
            self.drop = nn.Dropout(0.1)

        def forward(self, x, additive_mask):
            x = self.attention_norm(x + self.drop(self.attention_out(self.attention(x, additive_mask))))
            return self.output_norm(x + self.drop(self.output(F.gelu(self.intermediate(x)))))

    class Bert(nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = Embeddings()
            self.layers = nn.ModuleList(EncoderLayer() for _ in range(a.layers))
            if a.task == "mlm":
                self.transform = nn.Linear(a.hidden, a.hidden)
                self.transform_norm = nn.LayerNorm(a.hidden, eps=1e-12)
                self.decoder_bias = nn.Parameter(torch.zeros(a.vocab))
            else:
                self.pooler = nn.Linear(a.hidden, a.hidden)
                self.classifier_drop = nn.Dropout(0.1)
                self.classifier = nn.Linear(a.hidden, 2)
            for m in self.modules():
                if isinstance(m, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(m.weight, std=0.02)
                if isinstance(m, nn.Linear):
                    nn.init.zeros_(m.bias)

        def forward(self, ids, attention_mask, segments, labels):
            additive_mask = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
            x = self.embeddings(ids, segments)
            for layer in self.layers:
                x = layer(x, additive_mask)
            if a.task == "mlm":
                # .float(): under CPU autocast in torch 1.13 the GELU output stays bf16 and
                # layer_norm rejects a bf16 input with float32 weights. A no-op in f32.
                h = self.transform_norm(F.gelu(self.transform(x)).float())
                logits = F.linear(h, self.embeddings.word.weight, self.decoder_bias)
                return F.cross_entropy(logits.float().view(-1, a.vocab), labels.view(-1), ignore_index=-100)
            pooled = torch.tanh(self.pooler(x[:, 0]))
            return F.cross_entropy(self.classifier(self.classifier_drop(pooled)).float(), labels)

    return Bert()


def make_batch(a, generator):
    import torch
    ids = torch.randint(1, a.vocab, (a.batch, a.seq), generator=generator)
    attention_mask = torch.ones(a.batch, a.seq, dtype=torch.long)
    segments = torch.zeros(a.batch, a.seq, dtype=torch.long)
    if a.task == "mlm":
        scored = torch.rand(a.batch, a.seq, generator=generator) < 0.15
        labels = torch.where(scored, ids, torch.full_like(ids, -100))
    else:
        labels = torch.randint(0, 2, (a.batch,), generator=generator)
    return ids, attention_mask, segments, labels


def loaded_blas():
    names = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if "blas" in path or "dnnl" in path:
                names.add("/".join(path.split("/")[-2:]))
    return sorted(names)


def make_adamw(torch, params):
    # The fastest stock AdamW on the GPU: the fused kernel (torch >= 2.0), else the multi-tensor one.
    try:
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, fused=True), "adamw-fused"
    except (TypeError, RuntimeError, ValueError):
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=True), "adamw-foreach"


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    pin_thread_pools(a.threads)
    import contextlib
    import torch

    on_cuda = a.device == "cuda"
    if on_cuda and not torch.cuda.is_available():
        print(f"bert_train_peer: --device cuda but torch {torch.__version__} sees no GPU", file=sys.stderr)
        return 1
    torch.set_num_threads(a.threads)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    torch.manual_seed(a.seed)
    generator = torch.Generator().manual_seed(a.seed + 1)

    model = build_model(a)  # initialised on the CPU, then moved: the same weights on either device
    if on_cuda:
        device = torch.device("cuda", 0)
        model.to(device)  # the decoder uses embeddings.word.weight itself: the tie survives the move
        params = list(model.parameters())
        optimizer, optimizer_name = make_adamw(torch, params)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01,
                                      **({"fused": True} if a.fused else {}))
    model.train()
    if a.compile:
        model = torch.compile(model)  # parameters stay the module's: the optimizer above holds them
    autocast = (lambda: torch.autocast(a.device, dtype=torch.bfloat16)) if a.dtype == "bf16" \
        else contextlib.nullcontext

    times_ms, losses = [], []
    for step in range(a.warmup + a.steps):
        ids, attention_mask, segments, labels = make_batch(a, generator)
        if on_cuda:
            ids, attention_mask, segments, labels = (x.to(device) for x in (ids, attention_mask, segments, labels))
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        with autocast():
            loss = model(ids, attention_mask, segments, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if on_cuda:
            torch.cuda.synchronize()
        elapsed = (time.perf_counter() - t0) * 1e3
        losses.append(loss.item())
        if step >= a.warmup:
            times_ms.append(elapsed)

    median = statistics.median(times_ms)
    result = {
        "kind": "result", "framework": "pytorch", "config": a.config or "", "task": a.task, "dtype": a.dtype,
        "layers": a.layers, "hidden": a.hidden, "heads": a.heads, "ffn": a.ffn, "vocab": a.vocab,
        "seq": a.seq, "batch": a.batch, "threads": a.threads, "steps": a.steps,
        "median_step_ms": round(median, 2), "min_step_ms": round(min(times_ms), 2),
        "tokens_per_s": round(a.batch * a.seq / (median / 1e3), 1),
        "gflops_per_s": round(step_flops(a) / (median / 1e3) / 1e9, 1),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
        "params": sum(p.numel() for p in model.parameters()),
        "first_loss": round(losses[0], 4), "last_loss": round(losses[-1], 4),
        "mode": "+".join(m for m in ("sdpa", "fused", "compile") if getattr(a, m)) or "eager",
        "torch": torch.__version__, "blas": loaded_blas(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }
    if on_cuda:
        # The fields of bert_train --device cuda: device memory in place of RSS, MFU on the GPU peak.
        achieved = step_flops(a) / (median / 1e3)
        del result["peak_rss_mb"]
        result.update({
            "device": "cuda", "gpu": torch.cuda.get_device_name(0), "max_step_ms": round(max(times_ms), 2),
            "tflops_per_s": round(achieved / 1e12, 2), "peak_tflops": a.peak_tflops,
            "mfu": round(achieved / (a.peak_tflops * 1e12), 3),
            "peak_gpu_mb": round(torch.cuda.max_memory_allocated(0) / 2**20, 1),
            "optimizer": optimizer_name,
        })
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
