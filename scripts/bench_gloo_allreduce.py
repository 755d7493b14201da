#!/usr/bin/env python3
"""Gloo's TCP allreduce on loopback, timed the way `terse bench allreduce` times its own (the baseline the tcp
transport is compared with; scripts/bench-tcp-vs-gloo runs both in one window).

n processes (torch.multiprocessing), torch.distributed with backend gloo over 127.0.0.1, a float32 tensor of SIZE
bytes. After the warm-up the timed iterations run in min(iters, 5) batches of iters / batches back-to-back operations,
each batch after a barrier; a batch's time is the slowest rank's, and the figure is the median batch divided by its
operations, as experiments/cli/bench/collective.cc times terse's (a median over single operations would drop the slow
ones a batch keeps). busbw = size * 2(n-1)/n / time (nccl-tests' allreduce factor). The
result is checked after the timed loop (integer data, exact in f32).

Needs PyTorch (CPU is enough), e.g. in a venv outside the repository:
    python3 -m venv /tmp/gloo-venv && /tmp/gloo-venv/bin/pip install torch numpy
    /tmp/gloo-venv/bin/python scripts/bench_gloo_allreduce.py -n 2 4 --size 4K 1M 64M --iters 10
or Debian's python3-torch (/usr/bin/python3).
"""
import argparse
import os
import socket
import time


def parse_size(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1].upper()] if text[-1].upper() in units else int(text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker(rank, n, port, sizes, warmup, iters, out):
    import torch
    import torch.distributed as dist

    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n)
    for size in sizes:
        measure(rank, n, size, warmup, iters, out)
    dist.destroy_process_group()


def measure(rank, n, size, warmup, iters, out):
    import torch
    import torch.distributed as dist

    count = size // 4
    x = torch.ones(count, dtype=torch.float32)
    for _ in range(warmup):
        dist.all_reduce(x)
    batches = min(iters, 5)
    per_batch = iters // batches
    times = []
    for _ in range(batches):
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(per_batch):
            dist.all_reduce(x)
        times.append((time.perf_counter() - t0) / per_batch)
    # Correctness after the timed loop: element i of rank r is (i + r) % 7, so the sum is exact in f32.
    idx = torch.arange(count, dtype=torch.int64)
    x = ((idx + rank) % 7).to(torch.float32)
    dist.all_reduce(x)
    want = sum(((idx + r) % 7) for r in range(n)).to(torch.float32)
    wrong = int((x != want).sum())
    t = torch.tensor(times + [float(wrong)], dtype=torch.float64)
    gathered = [torch.zeros_like(t) for _ in range(n)]
    dist.all_gather(gathered, t)
    if rank == 0:
        per_batch = sorted(max(float(g[b]) for g in gathered) for b in range(batches))
        out.put((per_batch[batches // 2], sum(int(g[-1]) for g in gathered)))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-n", type=int, nargs="+", default=[2, 4], help="world sizes")
    p.add_argument("--size", nargs="+", default=["64M"], help="message bytes (K/M/G binary), one or more")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--iters", type=int, default=10)
    args = p.parse_args()
    import torch
    import torch.multiprocessing as mp

    sizes = [parse_size(s) for s in args.size]
    print(f"# gloo allreduce (torch {torch.__version__}), loopback, f32, median of {args.iters} after {args.warmup} warm-up")
    print("#  ranks        size   time(us)  algbw(GB/s)  busbw(GB/s)  #wrong")
    ctx = mp.get_context("spawn")
    for n in args.n:
        out = ctx.SimpleQueue()
        port = free_port()
        procs = [ctx.Process(target=worker, args=(r, n, port, sizes, args.warmup, args.iters, out)) for r in range(n)]
        for pr in procs:
            pr.start()
        for pr in procs:
            pr.join()
        if any(pr.exitcode != 0 for pr in procs):
            raise SystemExit(f"gloo run with {n} ranks failed")
        for size in sizes:  # one process group for every size: torch's import is seconds, paid once per world
            t, wrong = out.get()
            algbw = size / t / 1e9
            busbw = algbw * 2 * (n - 1) / n
            print(f"{n:8d} {size:11d} {t * 1e6:10.1f} {algbw:12.3f} {busbw:12.3f} {wrong:7d}")


if __name__ == "__main__":
    main()
