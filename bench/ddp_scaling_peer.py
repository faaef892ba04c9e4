#!/usr/bin/env python3
"""PyTorch DDP over Gloo: the peer of bench/ddp_scaling.

The bert_train_peer.py model and batches, trained with torch DistributedDataParallel
(bucket_cap_mb 25, Gloo) on --world-size processes of --threads threads each, every rank on
its own batches of --batch (weak scaling). Rank 0 prints one JSON line in ddp_scaling's shape;
the step time of a step is the slowest rank's.

  ddp_scaling_peer.py --config bert-mini --task cls --world-size 2 --threads 1
  ddp_scaling_peer.py --world-size 2 --rank 1 --master 10.0.0.1:29600 --comm-hook bf16

With --rank this process is that one rank of a job whose rank 0 serves the Gloo rendezvous at
--master (one process per machine, as bench/ddp_shaped_link.sh starts them); without it every
rank is spawned here. --comm-hook picks torch's bf16 / fp16 compression or PowerSGD
(--powersgd-rank, plain all-reduce for the first 2 iterations, as Ember's bench).

Run it with the settings bench/compare_bert_train.sh uses for PyTorch (README_bert.md).
"""
import json
import os
import socket
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import bert_train_peer as peer  # noqa: E402  (imports torch lazily)


def parse(argv):
    p = peer.argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", choices=sorted(peer.PRESETS), default="bert-mini")
    p.add_argument("--task", choices=["mlm", "cls"], default="cls")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--comm-hook", choices=["no", "fp16", "bf16", "power_sgd"], default="no")
    p.add_argument("--powersgd-rank", type=int, default=4)
    p.add_argument("--rank", type=int, default=None, help="run only this rank (with --master)")
    p.add_argument("--master", default=None, help="ADDR:PORT of rank 0's rendezvous (with --rank)")
    args = p.parse_args(argv)
    if (args.rank is None) != (args.master is None):
        p.error("--rank and --master go together")
    bert_args = peer.parse_args(["--config", args.config, "--task", args.task, "--threads", str(args.threads),
                                 "--batch", str(args.batch), "--seq", str(args.seq), "--seed", str(args.seed)])
    return args, bert_args


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def train_rank(rank, args, bert_args, port, wrap, report):
    """One rank of a weak-scaling run (fsdp_scaling_peer.py shares it): joins the Gloo group,
    builds the model, wrap(model, world) -> (module to call, optimizer), trains warmup + steps
    on this rank's own batches and calls report(times, torch) with the timed steps' ms, each the
    slowest rank's."""
    peer.pin_thread_pools(args.threads)
    import torch
    import torch.distributed as dist
    torch.set_num_threads(args.threads)
    world = args.world_size
    if world > 1:
        master = getattr(args, "master", None) or f"127.0.0.1:{port}"
        dist.init_process_group("gloo", init_method=f"tcp://{master}", rank=rank, world_size=world)
    torch.manual_seed(args.seed)
    model = peer.build_model(bert_args)
    model.train()
    net, optimizer = wrap(model, world)
    generator = torch.Generator().manual_seed(args.seed + 1 + 1000 * rank)
    times = []
    for step in range(args.warmup + args.steps):
        if step == args.warmup and world > 1:
            dist.barrier()
        ids, attention_mask, segments, labels = peer.make_batch(bert_args, generator)
        t0 = time.perf_counter()
        loss = net(ids, attention_mask, segments, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step >= args.warmup:
            times.append((time.perf_counter() - t0) * 1e3)
    if world > 1:
        t = torch.tensor(times, dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        times = t.tolist()
    report(times, torch)
    if world > 1:
        dist.destroy_process_group()


def run_ranks(worker, args, bert_args):
    """Runs worker(rank, args, bert_args, port) in this process (one rank) or in
    --world-size spawned processes."""
    port = free_port()
    if getattr(args, "rank", None) is not None:
        worker(args.rank, args, bert_args, port)
        return 0
    if args.world_size == 1:
        worker(0, args, bert_args, port)
        return 0
    import torch.multiprocessing as mp
    mp.spawn(worker, args=(args, bert_args, port), nprocs=args.world_size, join=True)
    return 0


def register_comm_hook(net, args):
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
    if args.comm_hook == "bf16":
        net.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif args.comm_hook == "fp16":
        net.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.comm_hook == "power_sgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=args.powersgd_rank,
                                            start_powerSGD_iter=2)
        net.register_comm_hook(state, powerSGD_hook.powerSGD_hook)


def worker(rank, args, bert_args, port):
    def wrap(model, world):
        import torch
        net = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=args.bucket_mb) if world > 1 else model
        if world > 1:
            register_comm_hook(net, args)
        return net, torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)

    def report(times, torch):
        if rank != 0:
            return
        median = statistics.median(times)
        print(json.dumps({
            "kind": "result", "framework": "pytorch", "task": args.task, "world_size": args.world_size,
            "threads": args.threads, "layers": bert_args.layers, "hidden": bert_args.hidden,
            "batch_per_rank": args.batch, "seq": args.seq, "steps": args.steps,
            "median_step_ms": round(median, 2),
            "tokens_per_s": round(args.batch * args.seq * args.world_size / (median / 1e3), 1),
            "comm_hook": args.comm_hook, "torch": torch.__version__}), flush=True)

    train_rank(rank, args, bert_args, port, wrap, report)


def main(argv=None):
    args, bert_args = parse(sys.argv[1:] if argv is None else argv)
    return run_ranks(worker, args, bert_args)


if __name__ == "__main__":
    sys.exit(main())
