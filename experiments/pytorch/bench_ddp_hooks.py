#!/usr/bin/env python3
"""Step time and bytes of DDP communication hooks, DDP's own beside terse's, on the quickstart MLP (784-256-128-10,
0.24M parameters) or a CNN of 4M parameters (--model cnn), batch 64 per worker, 2 workers (torch.multiprocessing,
gloo, CPU, one thread each).

Rows: DDP's default allreduce (its C++ path), the same allreduce as DDP's Python allreduce_hook (what any Python hook's
path costs), and terse's `none`; DDP's fp16_compress_hook and terse's fp16; DDP's PowerSGD hook
(rank 2, its error feedback and warm start) and terse's powersgd rank 2 with terse's error feedback. terse's hooks run
twice, overlapping backward (the default) and inside the hook (overlap=False), to show what the overlap hides; PowerSGD
also chained round by round (overlap="chain"), against its default worker thread.

Every configuration is its own model, DDP wrapper and hook in the same two processes, from the same initial parameters
on the same batches. They take turns step by step, the order rotating each cycle, so that a change in the host's load
hits all of them alike; each is timed over --steps steps after --warmup untimed ones (DDP's PowerSGD starts compressing
at step 2). Ratios are given twice: of the rows' medians, and as the median of the ratios of steps of one cycle. The table gives rank
0's median step time (forward, backward with the hook, optimizer step) with its interquartile range, the median of
backward alone (DDP waits for every hook's Future inside it), and for terse's hooks the time backward waited for the
hook per step (state.times()["exposed_s"]: with overlap, from DDP's hand-over of its last bucket to that bucket's
completion). Bytes are per worker per step: for terse's hooks, what its communicator handed to torch.distributed
(payload, and wire bytes sent under the ring model of experiments/python/torch_communicator.h); for DDP's, the same
ring model applied to the tensors their documented algorithms allreduce.

--one-bucket puts the whole model in one DDP bucket: DDP's PowerSGD hook aborts in gloo with several buckets on torch
1.13 (CPU: "op.preamble.length <= op.nbytes" in gloo's pair.cc), so compare PowerSGD with it. Without it, on torch 1.x
and a model larger than DDP's first bucket (the CNN), that row is left out, and the script says so.

--bucket-mb MB makes DDP's buckets (the first one too) MB MiB: --bucket-mb 0.25 splits the MLP into four, where a
chained hook's rounds overlap the rest of backward.

--bucket-rows adds terse's fp16 with granularity="bucket": the flat bucket as one tensor, which the engine sums in
place behind its header, where the default (tensor granularity, one fused group per bucket) copies every tensor's body
into one buffer and back. For an elementwise codec both give the same bits; the difference is the cost of those
copies. (none is summed where it lies at either granularity: its caps declare TERSE_CAP_IDENTITY, docs/pytorch.md.)

    PYTHONPATH=build/python python3 experiments/pytorch/bench_ddp_hooks.py [--model cnn] [--steps 600]
"""

import argparse
import os
import statistics
import tempfile
import time

# One thread per worker means OpenBLAS's too: Debian's torch multiplies through it, and its worker threads spin beside
# the ranks on a small host unless told otherwise. Set before torch loads OpenBLAS; the spawned workers inherit it.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as default_hooks  # noqa: E402
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as powerSGD  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import terse.torch  # noqa: E402

WORLD = 2
BATCH = 64


def build(name):
    torch.manual_seed(1)
    if name == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                             nn.Linear(128, 10))
    # 28x28 -> two 3x3 convolutions -> 2x2 pooling -> 64 x 12 x 12 -> 432 -> 10: 3.99M parameters, most of them in
    # the first fully-connected layer, as in the classic MNIST CNNs.
    return nn.Sequential(nn.Conv2d(1, 32, 3), nn.ReLU(), nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Flatten(), nn.Linear(64 * 12 * 12, 432), nn.ReLU(), nn.Linear(432, 10))


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
    return lambda m: (terse.torch.CompressionState(compressor, module=m, **kwargs), terse.torch.compression_hook)


def configs(model, bucket_rows=False):
    """(name, hook factory or None, DDP's bytes per step or None when terse counts them)."""
    dense = 4 * sum(p.numel() for p in model.parameters())
    rows = [("ddp-allreduce", None, dense)]
    # DDP's allreduce_hook, registered as any Python hook is: the same allreduce as the row above, reached through
    # DDP's Python comm-hook path (the GIL, a Python Future and its then() callback). What that path costs is a floor
    # under every Python hook, terse's among them, which the built-in C++ allreduce does not pay.
    rows += [("ddp-allreduce_hook (Python)", lambda m: (None, default_hooks.allreduce_hook), dense)]
    rows += [("terse-none" + tag, terse_hook("none", overlap=o), None) for tag, o in (("", True), (" (no overlap)",
                                                                                                 False))]
    rows += [("ddp-fp16_compress_hook", lambda m: (None, default_hooks.fp16_compress_hook), dense // 2)]
    rows += [("terse-fp16" + tag, terse_hook("fp16", overlap=o), None) for tag, o in (("", True), (" (no overlap)",
                                                                                                 False))]
    rows += [("ddp-powerSGD-r2", lambda m: (powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=2,
                                                                    start_powerSGD_iter=2), powerSGD.powerSGD_hook),
              ddp_powersgd_bytes(model, 2))]
    # On the worker thread (the default for a multi-round compressor), chained round by round on torch's asynchronous
    # all_reduce (overlap="chain"), and inside the hook.
    rows += [("terse-powersgd-r2-ef" + tag, terse_hook("powersgd", rank=2, error_feedback=True, overlap=o), None)
             for tag, o in (("", True), (" (chain)", "chain"), (" (no overlap)", False))]
    if bucket_rows:
        # The flat bucket as one tensor: a group of one, which the engine sums in place behind its header, against the
        # default tensor granularity's fused group (each tensor's body copied into one buffer and back). Not none: it
        # skips the plugin at either granularity.
        rows += [("terse-fp16 (bucket granularity)", terse_hook("fp16", granularity="bucket"), None)]
    return rows


class Row:
    """One configuration: its own model, DDP wrapper, hook and optimizer, from the same initial parameters."""

    def __init__(self, args, make_hook):
        self.model = build(args.model)
        cap = 1024 if args.one_bucket else (args.bucket_mb or 25)
        self.ddp = nn.parallel.DistributedDataParallel(self.model, bucket_cap_mb=cap)
        self.state = None
        if make_hook is not None:
            self.state, hook = make_hook(self.model)
            self.ddp.register_comm_hook(self.state, hook)
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01, momentum=0.9)
        self.steps, self.backwards = [], []
        self.exposed0 = 0.0

    def terse(self):
        return isinstance(self.state, terse.torch.CompressionState)

    def step(self, x, y, timed):
        dist.barrier()
        t0 = time.perf_counter()
        self.opt.zero_grad()
        loss = F.cross_entropy(self.ddp(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.opt.step()
        t3 = time.perf_counter()
        if timed:
            self.steps.append(t3 - t0)
            self.backwards.append(t2 - t1)


def worker(rank, store, args, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD)
    if args.one_bucket:
        # DDP caps its first bucket at this (1 MiB by default) whatever bucket_cap_mb says.
        dist._DEFAULT_FIRST_BUCKET_BYTES = 1 << 30
    elif args.bucket_mb:
        dist._DEFAULT_FIRST_BUCKET_BYTES = int(args.bucket_mb * (1 << 20))
    template = build(args.model)
    chosen = [c for c in configs(template, args.bucket_rows)
              if (not args.only or any(o in c[0] for o in args.only.split(","))) and c[0] not in args.skip]
    rows = [(name, ddp_bytes, Row(args, make_hook)) for name, make_hook, ddp_bytes in chosen]
    g = torch.Generator().manual_seed(rank)
    xs = torch.randn(16, BATCH, 1, 28, 28, generator=g)
    ys = torch.randint(0, 10, (16, BATCH), generator=g)
    for s in range(args.warmup):
        for _, _, row in rows:
            row.step(xs[s % 16], ys[s % 16], False)
    for _, _, row in rows:
        if row.terse():
            row.exposed0 = row.state.times()["exposed_s"]
    # Step by step, every configuration once per cycle, the order rotating from cycle to cycle: a change of the host's
    # load hits every row alike, and no row always runs first (or right after the same neighbour).
    timed = args.steps
    for s in range(timed):
        shift = s % len(rows)
        for _, _, row in rows[shift:] + rows[:shift]:
            row.step(xs[s % 16], ys[s % 16], True)
    result = {}
    for name, ddp_bytes, row in rows:
        r = {"steps": row.steps, "backwards": row.backwards, "exposed": None}
        if row.terse():
            last = [b["last_step"] for b in row.state.buckets().values()]
            r["payload"] = sum(b["payload"] for b in last)
            r["sent"] = sum(b["wire_sent"] for b in last)
            r["exposed"] = (row.state.times()["exposed_s"] - row.exposed0) / timed
            row.state.close()
        else:
            r["payload"], r["sent"] = ddp_bytes, ring_sent(ddp_bytes)
        result[name] = r
    if rank == 0:
        with open(out, "w") as f:
            f.write(repr(result))
    # DDP's own Python hooks chain then() callbacks too, and torch takes the GIL on a gloo thread once more after each:
    # were the DDP wrappers freed (with the GIL held, joining gloo's threads) before that, the process would hang
    # (terse's state.close() waits for its own callbacks; terse/torch.py, CompressionState.close). Let the GIL go first.
    time.sleep(0.1)
    dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--steps", type=int, default=600, help="timed steps per configuration")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--one-bucket", action="store_true", help="the whole model in one DDP bucket")
    p.add_argument("--bucket-mb", type=float, default=0.0,
                   help="DDP buckets of this many MiB, the first one too (several buckets on the MLP: 0.25)")
    p.add_argument("--bucket-rows", action="store_true",
                   help="add terse fp16 with granularity='bucket' (no fusion copies)")
    p.add_argument("--only", default="", help="comma-separated fragments: run only the rows whose name has one")
    args = p.parse_args()
    if args.one_bucket and args.bucket_mb:
        p.error("--one-bucket and --bucket-mb exclude each other")
    # DDP's PowerSGD hook aborts the process in gloo once the model spans several buckets (torch 1.13, CPU), and with
    # the rows interleaved that abort would take every row with it: leave its row out, saying so.
    args.skip = []
    first_bucket = int(args.bucket_mb * (1 << 20)) or getattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES", 1 << 20)
    if (not args.one_bucket and int(torch.__version__.split(".")[0]) < 2
            and 4 * sum(q.numel() for q in build(args.model).parameters()) > first_bucket):
        args.skip.append("ddp-powerSGD-r2")
        print("leaving out ddp-powerSGD-r2: DDP's PowerSGD hook aborts gloo with several buckets on torch %s; compare "
              "PowerSGD with --one-bucket" % torch.__version__)
    names = [c[0] for c in configs(build(args.model), args.bucket_rows) if c[0] not in args.skip]
    if args.only and not any(o in n for n in names for o in args.only.split(",")):
        p.error("--only %r matches none of the rows: %s" % (args.only, ", ".join(names)))
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows")
        mp.spawn(worker, args=(os.path.join(tmp, "store"), args, out), nprocs=WORLD)
        rows = eval(open(out).read())  # noqa: S307  (our own repr of dicts of numbers)
    params = sum(p.numel() for p in build(args.model).parameters())
    print("DDP %s (%d parameters), batch %d, %d workers, gloo, CPU, %s; %d steps per row, interleaved" % (
        args.model, params, BATCH, WORLD,
        "one bucket" if args.one_bucket else ("%g MiB buckets" % args.bucket_mb if args.bucket_mb else "DDP's buckets"),
        args.steps))
    print("| hook | step ms (median) | IQR ms | backward ms | exposed hook ms | payload B/step | wire sent B/step |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, row in rows.items():
        t = sorted(row["steps"])
        q1, q3 = t[len(t) // 4], t[3 * len(t) // 4]
        exposed = "" if row["exposed"] is None else "%.3f" % (1e3 * row["exposed"])
        print("| %s | %.3f | %.3f-%.3f | %.3f | %s | %d | %d |" % (
            name, 1e3 * statistics.median(t), 1e3 * q1, 1e3 * q3, 1e3 * statistics.median(row["backwards"]),
            exposed, row["payload"], row["sent"]))
    print()
    print("ratios of medians, same run:")
    for ours, theirs in (("terse-none", "ddp-allreduce"), ("ddp-allreduce_hook (Python)", "ddp-allreduce"),
                         ("terse-none", "ddp-allreduce_hook (Python)"), ("terse-fp16", "ddp-fp16_compress_hook"),
                         ("terse-powersgd-r2-ef", "ddp-powerSGD-r2")):
        if ours not in rows or theirs not in rows:
            continue
        # Paired: the same cycle's steps, so slow drifts of the host's load cancel.
        paired = [a / b for a, b in zip(rows[ours]["steps"], rows[theirs]["steps"])]
        print("  %s / %s = %.3f (median of per-cycle ratios %.3f)" % (
            ours, theirs, statistics.median(rows[ours]["steps"]) / statistics.median(rows[theirs]["steps"]),
            statistics.median(paired)))


if __name__ == "__main__":
    main()
