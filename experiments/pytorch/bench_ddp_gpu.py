#!/usr/bin/env python3
"""Step time of DDP communication hooks on a GPU, DDP's own beside terse's: torchvision's ResNet-50 (25.6M parameters)
at batch 64 of synthetic 224x224 images, one process, NCCL (issue 39's GPU check; scripts/gpu-check --torch runs it).

Rows: DDP's default allreduce; DDP's fp16_compress_hook; DDP's PowerSGD hook at rank 4 (its error feedback and warm
start); terse's none, fp16, powersgd rank 4 + EF, top-k 1% + EF and qsgd (127 levels), each overlapping backward (the
default); top-k again with every tensor on its grid-wide selection (TERSE_SPARSE_ONE_BLOCK_MAX=0, "-grid"); fp16 and
top-k again with every decode waiting for its own payload check (TERSE_DEFER_VERDICTS=0, "-sync"); fp16 chained on
the asynchronous collectives instead of the worker thread (overlap="chain", "-chain"); and
terse's none, fp16 and top-k with granularity="bucket" (the flat bucket as one tensor) and with
stream="side" (a stream of the hook's own). Every row is its own model, DDP wrapper and hook in the same process, from
the same initial parameters on the same batches; after --warmup untimed steps each (DDP's PowerSGD compresses from step
2), the rows take turns step by step for --steps timed steps each, the order rotating each cycle, so that a change in
the machine's state hits every row alike, and each row is built and warmed up once. A step is forward, backward with
the hook, and the optimizer, ended by torch.cuda.synchronize(): the table gives its median and interquartile range, and
the ratios are given of the rows' medians and as the median of the ratios of steps of one cycle.

One rank moves nothing over the network, so a row's time above DDP's default is the hook's own cost on the device:
`codec share` is (row - ddp-allreduce) / row, the fraction of the step the compressor adds (issue 39's target for
top-k: at most 10%). Device-to-host copies per step are counted by torch.profiler over --profile-steps steps after the
timed ones (the CUDA path copies no gradient to the host: expected 0 for every fixed-size compressor), and printed
after the timing table and its ratios, which are printed and flushed before the profiler's passes: a run killed during
them (scripts/gpu-check's deadline) keeps its timings. The last line says how many rows completed.

    python3 experiments/pytorch/bench_ddp_gpu.py [--steps 60] [--warmup 10] [--model resnet50]
    python3 experiments/pytorch/bench_ddp_gpu.py --world 2 [--steps 20]
        (two ranks sharing the GPU over gloo, WORLD_ROWS only: what the bound stream costs when a collective takes
        milliseconds)
    python3 experiments/pytorch/bench_ddp_gpu.py --device cpu --model resnet18 --batch 4 --steps 2 --warmup 1 [--world 2]
        (a CPU dry run of the script itself, gloo; its times mean nothing)
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.algorithms.ddp_comm_hooks.default_hooks as default_hooks
import torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook as powerSGD
import torch.nn as nn
import torch.nn.functional as F
import torchvision

import terse.torch


def terse_hook(compressor, env=None, **kwargs):
    """A row's hook factory; `env` is set while the state (and with it the plugin instance) is made."""
    def make(m):
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            return terse.torch.CompressionState(compressor, module=m, **kwargs), terse.torch.compression_hook
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return make


def rows():
    """(name, hook factory or None)."""
    return [
        ("ddp-allreduce", None),
        ("ddp-fp16_compress_hook", lambda m: (None, default_hooks.fp16_compress_hook)),
        ("ddp-powerSGD-r4", lambda m: (powerSGD.PowerSGDState(process_group=None, matrix_approximation_rank=4,
                                                               start_powerSGD_iter=2), powerSGD.powerSGD_hook)),
        ("terse-none", terse_hook("none")),
        ("terse-fp16", terse_hook("fp16")),
        ("terse-powersgd-r4-ef", terse_hook("powersgd", rank=4, error_feedback=True)),
        ("terse-topk-1pct-ef", terse_hook("topk", ratio=0.01, error_feedback=True)),
        # Every tensor on the grid-wide selection and decode, as before the one-block kernels took the small ones
        # (terse/kit/one_block.hpp): what those save on this model, in the same run.
        ("terse-topk-1pct-ef-grid", terse_hook("topk", env={"TERSE_SPARSE_ONE_BLOCK_MAX": "0"}, ratio=0.01,
                                               error_feedback=True)),
        ("terse-qsgd", terse_hook("qsgd", levels=127)),
        # Every decode waiting for its own payload check, as before the plugins left their verdicts on the device
        # (terse/device_verdict_v1.h; the engine reads them once a bucket): what that saves, in the same run.
        ("terse-fp16-sync", terse_hook("fp16", env={"TERSE_DEFER_VERDICTS": "0"})),
        ("terse-topk-1pct-ef-sync", terse_hook("topk", env={"TERSE_DEFER_VERDICTS": "0"}, ratio=0.01,
                                               error_feedback=True)),
        # Chained on the asynchronous collectives as DDP's own hooks are (terse/torch.py, _OneRound): the encode
        # queued in the hook call, the decode in NCCL's callback on the same thread, on a side stream of the state's
        # (a chained state's default), the payload checks read once a step instead of once a bucket on the worker
        # thread. Not the default until this row says so.
        ("terse-fp16-chain", terse_hook("fp16", overlap="chain")),
    ] + [(name + suffix, terse_hook(compressor, **kwargs, **variant))
         for suffix, variant in VARIANTS for name, compressor, kwargs in VARIANT_ROWS]


# Rows run again with one option changed, beside the defaults, to show what the per-tensor path costs: "-bucket" is
# the flat bucket as one tensor (granularity="bucket": one codec call and collective per bucket instead of one per
# parameter; the same bits for none and fp16, another selection for top-k, k of the bucket); "-side" runs the codecs
# and collectives on a stream of the state's own (stream="side": a decode's synchronization waits for the hook's work
# only, not for the backward kernels queued behind the bucket).
VARIANTS = [("-bucket", {"granularity": "bucket"}), ("-side", {"stream": "side"})]
VARIANT_ROWS = [("terse-none", "none", {}), ("terse-fp16", "fp16", {}),
                ("terse-topk-1pct-ef", "topk", {"ratio": 0.01, "error_feedback": True})]
# Issue 39's GPU targets: each terse row (and its variants) against DDP's own hook for the same job.
TARGETS = [("terse-fp16", "ddp-fp16_compress_hook"), ("terse-powersgd-r4-ef", "ddp-powerSGD-r4"),
           ("terse-none", "ddp-allreduce")]


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def d2h_per_step(step_fn, steps, device):
    if device.type != "cuda":
        return None
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step_fn()
        sync(device)
    copies = sum(1 for e in prof.events() if "memcpy dtoh" in e.name.lower())
    return copies / steps


class Row:
    """One row: its model, DDP wrapper, hook and optimizer, built once."""

    def __init__(self, args, device, make_hook, data):
        torch.manual_seed(1)
        model = getattr(torchvision.models, args.model)(num_classes=1000).to(device)
        self.ddp = nn.parallel.DistributedDataParallel(model,
                                                       device_ids=[device.index] if device.type == "cuda" else None)
        self.state = None
        if make_hook is not None:
            self.state, hook = make_hook(model)
            self.ddp.register_comm_hook(self.state, hook)
        self.opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        self.device, self.data, self.count = device, data, 0
        self.times = []

    def step(self):
        xs, ys = self.data
        s = self.count
        self.count += 1
        self.opt.zero_grad(set_to_none=True)
        F.cross_entropy(self.ddp(xs[s % len(xs)]), ys[s % len(ys)]).backward()
        self.opt.step()

    def timed_step(self):
        sync(self.device)
        t0 = time.perf_counter()
        self.step()
        sync(self.device)
        self.times.append(time.perf_counter() - t0)

    def raise_if_failed(self):
        """Raises the hook's error if it failed: a failed row's times are no measurement."""
        if isinstance(self.state, terse.torch.CompressionState):
            self.state.raise_if_failed()

    def finish(self, profile_steps):
        """Device-to-host copies per step (None on the CPU); raises the hook's error if it failed; stops its worker."""
        d2h = d2h_per_step(self.step, profile_steps, self.device)
        self.raise_if_failed()
        if isinstance(self.state, terse.torch.CompressionState):
            self.state.close()
        return d2h


# The rows of a run at several ranks (--world): what the bound stream costs when a collective takes time. Two ranks
# share the one GPU over gloo (NCCL refuses two ranks on one device), which stages CUDA tensors through the host, so
# each bucket's all_reduce takes milliseconds. On torch's current stream ("current", the worker's default) the decode
# after it holds every backward kernel queued behind it; on a side stream (`-side`, and the chain's default) it does
# not. One GPU shared by two processes is not a cluster, but both streams share it alike.
WORLD_ROWS = ["ddp-allreduce", "ddp-fp16_compress_hook", "terse-fp16", "terse-fp16-side", "terse-fp16-chain",
              "terse-fp16-chain-current"]


def run(rank, args, store):
    world = args.world
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
    backend = "nccl" if device.type == "cuda" and world == 1 else "gloo"
    dist.init_process_group(backend, init_method="file://" + store, rank=rank, world_size=world)
    g = torch.Generator().manual_seed(rank)
    data = ([torch.randn(args.batch, 3, 224, 224, generator=g).to(device) for _ in range(4)],
            [torch.randint(0, 1000, (args.batch,), generator=g).to(device) for _ in range(4)])
    every = rows() + ([("terse-fp16-chain-current", terse_hook("fp16", overlap="chain", stream="current"))]
                      if world > 1 else [])
    chosen = [(name, make) for name, make in every
              if (any(o in name for o in args.only.split(",")) if args.only else world == 1 or name in WORLD_ROWS)]
    built = [(name, Row(args, device, make, data)) for name, make in chosen]
    for _ in range(args.warmup):
        for _, row in built:
            row.step()
    # Step by step, every row once per cycle, the order rotating from cycle to cycle.
    for s in range(args.steps):
        shift = s % len(built)
        for _, row in built[shift:] + built[:shift]:
            row.timed_step()
    # The timings first, flushed, then the profiler's passes: those run every row again under torch.profiler, and a
    # run cut there (scripts/gpu-check's deadline kills it) still leaves the table it measured.
    for _, row in built:
        row.raise_if_failed()
    if rank == 0:
        report(args, device, backend, {name: row.times for name, row in built})
    copies = {name: row.finish(args.profile_steps) for name, row in built}
    dist.destroy_process_group()
    if rank == 0:
        report_copies(args, copies)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="resnet50", help="a torchvision.models constructor (resnet50, resnet18, ...)")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--steps", type=int, default=60, help="timed steps per row")
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--profile-steps", type=int, default=3, help="steps profiled for device-to-host copies")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--only", default="", help="comma-separated fragments: run only the rows whose name has one")
    p.add_argument("--world", type=int, default=1,
                   help="ranks: 1 (NCCL), or several processes sharing the device over gloo, running WORLD_ROWS")
    args = p.parse_args()
    if args.world < 1:
        p.error("--world must be at least 1, got %d" % args.world)
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        if args.world == 1:
            run(0, args, store)
        else:
            torch.multiprocessing.spawn(run, args=(args, store), nprocs=args.world)


def report(args, device, backend, table):
    what = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    params = sum(q.numel() for q in getattr(torchvision.models, args.model)().parameters())
    print("DDP %s (%d parameters), batch %d, %d rank%s, %s, %s, torch %s; %d steps per row, interleaved" % (
        args.model, params, args.batch, args.world, "" if args.world == 1 else "s sharing the device",
        "NCCL" if backend == "nccl" else "gloo", what, torch.__version__, args.steps))
    print("| hook | step ms (median) | IQR ms | codec share |")
    print("|---|---:|---:|---:|")
    base = statistics.median(table["ddp-allreduce"]) if "ddp-allreduce" in table else None
    for name, times in table.items():
        t = sorted(times)
        med = statistics.median(t)
        q1, q3 = t[len(t) // 4], t[3 * len(t) // 4]
        share = "%.3f" % ((med - base) / med) if base is not None and name != "ddp-allreduce" else ""
        print("| %s | %.2f | %.2f-%.2f | %s |" % (name, 1e3 * med, 1e3 * q1, 1e3 * q3, share))
    print()
    print("ratios of medians, same run (issue 39's GPU targets: terse's rows over DDP's, each <= 1.0; the rest compare "
          "terse's own ways -- top-k's one-block way over the grid-wide one, the deferred verdicts over a wait per "
          "tensor, the chain over the worker, a side stream over the current one -- and are no targets):")
    pairs = [(ours + suffix, theirs) for ours, theirs in TARGETS for suffix in [""] + [v for v, _ in VARIANTS]]
    pairs += [("terse-topk-1pct-ef", "terse-topk-1pct-ef-grid"), ("terse-fp16", "terse-fp16-sync"),
              ("terse-topk-1pct-ef", "terse-topk-1pct-ef-sync"), ("terse-fp16-chain", "ddp-fp16_compress_hook"),
              ("terse-fp16-chain", "terse-fp16"), ("terse-fp16-side", "terse-fp16"),
              ("terse-fp16-chain-current", "terse-fp16-chain")]
    for ours, theirs in pairs:
        if ours in table and theirs in table:
            paired = [a / b for a, b in zip(table[ours], table[theirs])]
            print("  %s / %s = %.3f (median of per-cycle ratios %.3f)" % (
                ours, theirs, statistics.median(table[ours]) / statistics.median(table[theirs]),
                statistics.median(paired)))
    sys.stdout.flush()


def report_copies(args, copies):
    """The profiler's count of device-to-host copies per step, row by row (None: a CPU run, where none is counted)."""
    print()
    if any(c is None for c in copies.values()):
        print("device-to-host copies per step: not counted (the CPU)")
    else:
        print("device-to-host copies per step (torch.profiler, %d steps after the timed ones; the CUDA path copies no "
              "gradient to the host: 0.0 expected for every fixed-size compressor):" % args.profile_steps)
        print("| hook | device-to-host copies per step |")
        print("|---|---:|")
        for name, c in copies.items():
            print("| %s | %.1f |" % (name, c))
    print("bench_ddp_gpu.py: %d rows done" % len(copies))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
