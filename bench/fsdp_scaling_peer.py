#!/usr/bin/env python3
"""PyTorch FSDP2 and DDP over Gloo: the peer of bench/fsdp_scaling.

The bert_train_peer.py MLM model and batches on --world-size processes of --threads threads
each, every rank on its own batches of --batch (weak scaling), AdamW lr 1e-4. --mode names
fsdp_scaling's mode; what PyTorch runs for it:

  ddp, NO_SHARD     DistributedDataParallel (bucket_cap_mb 25); FSDP2 has no NO_SHARD
  SHARD_OPTIMIZER   DistributedDataParallel + ZeroRedundancyOptimizer(AdamW) (ZeRO stage 1)
  SHARD_GRAD_OP     fully_shard on every encoder layer and the root, reshard_after_forward=False
  FULL_SHARD        the same with reshard_after_forward=True
  FULL_SHARD_AC     FULL_SHARD with every encoder layer run under torch.utils.checkpoint
                    (non-reentrant), applied before fully_shard

Every rank prints one JSON line in fsdp_scaling's shape: the job's median step time (the
slowest rank per step), global tokens/s and this process's peak RSS (resource.getrusage; torch
has no CPU allocator statistics).

  fsdp_scaling_peer.py --mode FULL_SHARD --world-size 2 --threads 1

Run it with the settings bench/compare_bert_train.sh uses for PyTorch (README_bert.md).
"""
import json
import os
import resource
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bert_train_peer as peer  # noqa: E402  (imports torch lazily)
import ddp_scaling_peer as ddp_peer  # noqa: E402

MODES = ["ddp", "NO_SHARD", "SHARD_OPTIMIZER", "SHARD_GRAD_OP", "FULL_SHARD", "FULL_SHARD_AC"]
PEER_NAMES = {
    "ddp": "DDP", "NO_SHARD": "DDP", "SHARD_OPTIMIZER": "DDP + ZeroRedundancyOptimizer",
    "SHARD_GRAD_OP": "fully_shard(reshard_after_forward=False)", "FULL_SHARD": "fully_shard",
    "FULL_SHARD_AC": "fully_shard + checkpoint",
}


def parse(argv):
    p = peer.argparse.ArgumentParser(description=__doc__, formatter_class=peer.argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, default="FULL_SHARD")
    p.add_argument("--config", choices=sorted(peer.PRESETS), default="bert-mini")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    bert_args = peer.parse_args(["--config", args.config, "--task", "mlm", "--threads", str(args.threads),
                                 "--batch", str(args.batch), "--seq", str(args.seq), "--seed", str(args.seed)])
    return args, bert_args


def wrap(model, mode, world):
    """The module to call and the optimizer, for `mode` on `world` ranks."""
    import torch
    if world == 1:
        return model, torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    if mode in ("ddp", "NO_SHARD", "SHARD_OPTIMIZER"):
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=25)
        if mode == "SHARD_OPTIMIZER":
            from torch.distributed.optim import ZeroRedundancyOptimizer
            return net, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW,
                                                lr=1e-4, weight_decay=0.01)
        return net, torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.utils.checkpoint import checkpoint

    class Checkpointed(torch.nn.Module):
        # Recomputes the layer's forward in backward instead of keeping its activations.
        def __init__(self, layer):
            super().__init__()
            self.layer = layer

        def forward(self, x, additive_mask):
            return checkpoint(self.layer, x, additive_mask, use_reentrant=False)

    mesh = init_device_mesh("cpu", (world,))
    reshard = mode != "SHARD_GRAD_OP"
    for i, layer in enumerate(model.layers):
        if mode == "FULL_SHARD_AC":
            layer = model.layers[i] = Checkpointed(layer)
        fully_shard(layer, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)


def worker(rank, args, bert_args, port):
    def report(times, torch):
        median = statistics.median(times)
        print(json.dumps({
            "kind": "result", "framework": "pytorch", "mode": args.mode, "peer": PEER_NAMES[args.mode], "rank": rank,
            "world_size": args.world_size, "threads": args.threads, "layers": bert_args.layers,
            "hidden": bert_args.hidden, "batch_per_rank": args.batch, "seq": args.seq, "steps": args.steps,
            "median_step_ms": round(median, 2),
            "tokens_per_s": round(args.batch * args.seq * args.world_size / (median / 1e3), 1),
            "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0, 1),
            "torch": torch.__version__}), flush=True)

    ddp_peer.train_rank(rank, args, bert_args, port, lambda model, world: wrap(model, args.mode, world), report)


def main(argv=None):
    args, bert_args = parse(sys.argv[1:] if argv is None else argv)
    return ddp_peer.run_ranks(worker, args, bert_args)


if __name__ == "__main__":
    sys.exit(main())
