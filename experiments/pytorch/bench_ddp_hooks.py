#!/usr/bin/env python3
"""Step time and bytes of DDP communication hooks on the quickstart MLP (784-256-128-10), batch 64 per worker,
2 workers (torch.multiprocessing, gloo, CPU, one thread each): DDP's default allreduce, DDP's fp16_compress_hook
beside terse's fp16, DDP's PowerSGD hook (rank 2, its error feedback and warm start) beside terse's powersgd rank 2
with terse's error feedback.

Every configuration runs in the same two processes, one after another, from the same initial parameters on the same
batches; each is timed over --steps steps after --warmup untimed ones (DDP's PowerSGD starts compressing at step 2),
and the table gives the median step time of rank 0 (forward, backward with the hook, optimizer step), with the
interquartile range. Bytes are per worker per step: for terse's hooks, what its communicator handed to
torch.distributed (payload, and wire bytes sent under the ring model of experiments/python/torch_communicator.h);
for DDP's built-ins, the same ring model applied to the tensors their documented algorithms allreduce (dense: the
f32 gradients; fp16: half of that; PowerSGD: P and Q of each compressed matrix, the rest uncompressed).

    PYTHONPATH=build-cpu/python python3 experiments/pytorch/bench_ddp_hooks.py [--steps 300] [--rounds 2]
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as default_hooks
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as powerSGD
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import terse.torch

WORLD = 2
BATCH = 64


def mlp():
    torch.manual_seed(1)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def ring_sent(nbytes):
    return nbytes * 2 * (WORLD - 1) // WORLD


def ddp_powersgd_bytes(model, rank_r, min_rate=2):
    """f32 bytes DDP's PowerSGD hook allreduces per step (powerSGD_hook.py: _should_compress)."""
    total, uncompressed = 0, 0
    for p in model.parameters():
        if p.dim() >= 2:
            n, m = p.shape[0], p.numel() // p.shape[0]
            if (n + m) * rank_r * min_rate < n * m:
                total += (n + m) * rank_r
                continue
        uncompressed += p.numel()
    return 4 * (total + uncompressed)


def terse_hook(compressor, **kwargs):
    return terse.torch.CompressionState(compressor, **kwargs), terse.torch.compression_hook


def configs(model):
    dense = 4 * sum(p.numel() for p in model.parameters())
    return [
        ("ddp-allreduce", None, lambda m: ring_sent(dense), dense),
        ("ddp-fp16_compress_hook", lambda m: (None, default_hooks.fp16_compress_hook), lambda m: ring_sent(dense // 2),
         dense // 2),
        ("terse-fp16", lambda m: terse_hook("fp16", module=m), None, None),
        ("ddp-powerSGD-r2", lambda m: (powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                                               start_powerSGD_iter=2), powerSGD.powerSGD_hook),
         lambda m: ring_sent(ddp_powersgd_bytes(m, 2)), ddp_powersgd_bytes(model, 2)),
        ("terse-powersgd-r2-ef", lambda m: terse_hook("powersgd", rank=2, error_feedback=True, module=m), None, None),
    ]


def run_one(rank, name, make_hook, steps, warmup):
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = None
    if make_hook is not None:
        state, hook = make_hook(model)
        ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    g = torch.Generator().manual_seed(rank)
    xs = torch.randn(16, BATCH, 784, generator=g)
    ys = torch.randint(0, 10, (16, BATCH), generator=g)
    times = []
    for s in range(warmup + steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        F.cross_entropy(ddp(xs[s % 16]), ys[s % 16]).backward()
        opt.step()
        t1 = time.perf_counter()
        if s >= warmup:
            times.append(t1 - t0)
    sent = payload = None
    if isinstance(state, terse.torch.CompressionState):
        last = [b["last_step"] for b in state.buckets().values()]
        sent = sum(b["wire_sent"] for b in last)
        payload = sum(b["payload"] for b in last)
    return times, sent, payload, model


def worker(rank, store, steps, warmup, rounds, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    rows = {}
    template = mlp()
    for _ in range(rounds):
        for name, make_hook, sent_fn, payload_model in configs(template):
            times, sent, payload, model = run_one(rank, name, make_hook, steps, warmup)
            row = rows.setdefault(name, {"times": []})
            row["times"] += times
            row["sent"] = sent if sent is not None else sent_fn(model)
            row["payload"] = payload if payload is not None else payload_model
            row["measured"] = sent is not None
    if rank == 0:
        with open(out, "w") as f:
            f.write(repr(rows))
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=300, help="timed steps per configuration and round")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--rounds", type=int, default=2, help="passes over the configurations (interleaved)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows")
        mp.spawn(worker, args=(os.path.join(tmp, "store"), args.steps, args.warmup, args.rounds, out), nprocs=WORLD)
        rows = eval(open(out).read())  # noqa: S307  (our own repr of dicts of numbers)
    base = statistics.median(rows["ddp-allreduce"]["times"])
    print("DDP MLP 784-256-128-10, batch %d, %d workers, gloo, CPU; %d steps x %d rounds per row" % (
        BATCH, WORLD, args.steps, args.rounds))
    print("| hook | step ms (median) | IQR ms | vs allreduce | payload B/step | wire sent B/step | bytes |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for name, row in rows.items():
        t = sorted(row["times"])
        q1, q3 = t[len(t) // 4], t[3 * len(t) // 4]
        med = statistics.median(t)
        print("| %s | %.3f | %.3f-%.3f | %.2fx | %d | %d | %s |" % (
            name, 1e3 * med, 1e3 * q1, 1e3 * q3, med / base, row["payload"], row["sent"],
            "measured by terse's communicator" if row["measured"] else "ring model of the hook's allreduces"))


if __name__ == "__main__":
    main()
