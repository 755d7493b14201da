#!/usr/bin/env python3
"""terse.torch's DDP hook on CUDA tensors (issue 39, the device path of experiments/python/terse/torch.py), one ctest
case per subcommand (tests/python/CMakeLists.txt, labels python and gpu_torch). Without a CUDA device -- a CPU build of
torch, or no GPU -- every case exits 77, which ctest reports as skipped; scripts/gpu-check counts that skip as a failure
on a GPU machine.

  bits_nccl    one rank, NCCL: for each built-in compressor with device code (and its usual options), the gradients
               the hook leaves in the CUDA model equal, bit for bit, those of the same hook on a CPU copy of the model
               over gloo, for 4 steps of error feedback and warm starts; the model has several DDP buckets and odd
               sizes. PowerSGD is the one exception, as in the device suite: cuBLAS sums in f32 where the host sums in
               double, so its matrices are held to the tolerance of compressors/powersgd/powersgd.cc's header (its
               vectors, which travel uncompressed, bit for bit). A step of a fixed-size compressor copies from the
               device to the host exactly what plain DDP's step copies (torch.profiler; DDP itself copies its rebuilt
               bucket layout once, at step 2), signsgd's included: its decompress checks the whole payload, prefix and
               all, on the device. (bf16, which gloo cannot sum, against torch's own bf16 rounding)
  bits_gloo2   the same with two ranks sharing GPU 0 over gloo (NCCL refuses two ranks on one device): gloo sums and
               gathers the CUDA payloads; the CPU reference runs over a second gloo group in the same processes; bf16
               is refused naming the communicator
  overlap      two ranks (gloo, CUDA): the first bucket's Future is not complete when the hook returns, and top-k + EF,
               PowerSGD r2 + EF and fp16 + EF give the same parameters with overlap and without, and with overlap on a
               side stream of the state's own (stream="side"), bit for bit; fp16 + EF and PowerSGD r2 + EF chained on
               the collectives (overlap="chain", on either stream) give them too
  local_sgd    two ranks (gloo, CUDA): terse.torch.LocalSGD with compressor none after 2 gradient steps, top-k + EF
               and PowerSGD r2 + EF from the first step, period 2: the replicas on the GPU agree bit for bit after
               each averaging and differ between, and follow the same run on a CPU copy (a second gloo group) within
               f32 rounding of the optimizer's steps (PowerSGD: within its tolerance above)
  refusals     a compressor without device code is refused at construction naming it, before any collective; a CPU
               model under an NCCL group is refused naming the backend; a bucket on another device than the state's
               is refused naming both

The gradients are made exact on both devices -- loss = sum(p * c) gives grad = c with no arithmetic -- so that every
difference is the hook's: the model's own math (cuBLAS against terse's fixed-order GEMM) never enters the comparison.
"""

import argparse
import math
import os
import sys
import tempfile
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

from checks import check, expect_error  # tests/python/checks.py, beside this file
from exact import Exact, exact_gradients  # tests/python/exact.py

terse = None  # imported by main() once a CUDA device is seen: a CPU-only host skips before needing the extension

SKIP = 77  # ctest's SKIP_RETURN_CODE for these cases

# Each built-in compressor with device code, as a user would configure it: (label, compressor, state keywords).
CASES = [
    ("none", "none", {}),
    ("fp16", "fp16", {}),
    ("qsgd", "qsgd", {"levels": 16}),
    ("terngrad", "terngrad", {}),
    ("onebit-ef", "onebit", {"error_feedback": True}),
    ("signsgd", "signsgd", {}),
    ("topk-ef", "topk", {"ratio": 0.05, "error_feedback": True}),
    ("randomk", "randomk", {"ratio": 0.05}),
    ("threshold-ef", "threshold", {"tau": 2.0, "error_feedback": True}),
    ("dgc", "dgc", {"ratio": 0.05, "error_feedback": True, "momentum_correction": 0.9}),
    ("powersgd-ef", "powersgd", {"rank": 2, "error_feedback": True}),
    # Chained on torch.distributed's asynchronous all_reduce (terse/torch.py, _OneRound): the encode in the hook call,
    # the decode in the collective's callback, the payload checks read once at the step's end.
    ("fp16-chain", "fp16", {"overlap": "chain"}),
    ("randomk-chain", "randomk", {"ratio": 0.05, "error_feedback": True, "overlap": "chain"}),
    # PowerSGD's two rounds chained (_Sequencer on the bound stream): round 1's check of the summed P stays on the
    # device (compress_deferred), so its encode can run in round 0's callback, under NCCL at once in the hook call.
    ("powersgd-chain", "powersgd", {"rank": 2, "error_feedback": True, "overlap": "chain"}),
]

# bf16 is not among them: gloo cannot sum bf16, so the CPU reference cannot run it. bf16_case checks it against
# torch's own rounding instead (world 1, NCCL) and its refusal under gloo.

# Odd sizes, a matrix for PowerSGD, a 4-D convolution weight, a vector; small buckets make several of them.
SHAPES = [(64, 48), (301,), (17, 5, 3, 3), (1000,), (33, 7)]
BUCKET_MB = 0.01


def gradients(step, rank):
    return exact_gradients(SHAPES, step, rank, spread=3)


def bits_equal(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.view(torch.int32), b.view(torch.int32))


def hooked(model, group, compressor, kwargs, device_ids=None, overlap=True):
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=device_ids, process_group=group,
                                              bucket_cap_mb=BUCKET_MB)
    options = dict(overlap=overlap)
    options.update(kwargs)  # a case's own overlap= wins
    state = terse.torch.CompressionState(compressor, module=model, process_group=group, **options)
    ddp.register_comm_hook(state, terse.torch.compression_hook)
    return ddp, state


def d2h_copies(fn):
    """Device-to-host memcpys the CUDA work of fn() issued, as torch.profiler sees them."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if "memcpy dtoh" in e.name.lower())


# PowerSGD's tolerance (compressors/powersgd/powersgd.cc's header): ||D_dev - D_host||_F <= 8 u K S ||M||_F, u = 2^-24,
# K = max(n, m) of the tensor's matrix view, S = steps since Q was drawn (all of them: warm starts). With error
# feedback M = g + e, and e = M - D is no larger than M (D is M's projection), so ||M_s|| <= sum of ||g_j|| for j <= s.
def powersgd_tolerance(shape, steps, grad_norms):
    n = shape[0]
    m = math.prod(shape) // n
    return 8.0 * 2.0 ** -24 * max(n, m) * steps * sum(grad_norms)


def plain_ddp_copies(rank, steps, device):
    """Device-to-host copies per step of DDP's own allreduce on the same model and buckets: DDP's share."""
    model = Exact(SHAPES).to(device)
    ddp = nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=BUCKET_MB)
    copies = []
    for step in range(steps):
        model.zero_grad(set_to_none=True)
        cs_dev = [c.to(device) for c in gradients(step, rank)]
        torch.cuda.synchronize()
        copies.append(d2h_copies(lambda: ddp(cs_dev).backward()))
    return copies


def bits(rank, world, cpu_group, steps=4):
    device = torch.device("cuda", 0)
    failures = []
    base = plain_ddp_copies(rank, steps, device) if world == 1 else None
    # Per tensor and step, the norms of the ranks' gradients added up: PowerSGD compresses the ranks' sum of M, whose
    # norm is at most the sum of theirs (the average's tolerance is then 1/world of this: the bound stays safe).
    norms = [[sum(float(gradients(step, r)[i].norm()) for r in range(world)) for step in range(steps)]
             for i in range(len(SHAPES))]
    for label, compressor, kwargs in CASES:
        mine = []
        host = Exact(SHAPES)
        cuda = Exact(SHAPES).to(device)
        host_ddp, host_state = hooked(host, cpu_group, compressor, kwargs)
        cuda_ddp, cuda_state = hooked(cuda, None, compressor, kwargs, device_ids=[0])
        check(cuda_state.device == device, "%s: the state bound to %s" % (label, cuda_state.device))
        copies = []
        worst = 0.0  # PowerSGD: the largest ||diff||_F / tolerance seen
        for step in range(steps):
            cs = gradients(step, rank)
            for m in (host, cuda):
                m.zero_grad(set_to_none=True)
            host_ddp(cs).backward()
            cs_dev = [c.to(device) for c in cs]
            torch.cuda.synchronize()
            copies.append(d2h_copies(lambda: cuda_ddp(cs_dev).backward()))
            for i, (a, b) in enumerate(zip(host.ps, cuda.ps)):
                got = b.grad.cpu()
                if bits_equal(a.grad, got):
                    continue
                diff = (a.grad.double() - got.double()).norm().item()
                if compressor == "powersgd" and a.dim() >= 2:
                    tau = powersgd_tolerance(tuple(a.shape), step + 1, norms[i][:step + 1])
                    worst = max(worst, diff / tau)
                    if diff <= tau:
                        continue
                mine.append("%s step %d tensor %d %s: CUDA gradients differ from the host path's (||diff||_F %.3g, "
                            "max |diff| %.3g)" % (label, step, i, tuple(a.shape), diff,
                                                  (a.grad - got).abs().max().item()))
                break
        if compressor == "none":
            # An identity compressor sums each bucket where it lies on the device too (ddp_aggregator.h, "In
            # place"): the bits above are then the in-place sum's, against the host's in-place sum. Each bucket's
            # bytes show the path taken: the body alone and one tensor (the plugin path adds a header per tensor).
            for side, state in (("host", host_state), ("cuda", cuda_state)):
                if not state._agg.in_place:
                    mine.append("none: the %s state does not sum in place" % side)
                for index, b in state.buckets().items():
                    if b["last_step"]["payload"] != 4 * b["numel"] or b["tensors"] != 1:
                        mine.append("none: the %s state's bucket %d went through the plugin: %r" % (side, index, b))
        if kwargs.get("overlap") == "chain":
            if cuda_state._chain is not True:
                mine.append("%s: the CUDA state did not chain its buckets" % label)
            # The payload checks are read once a step, at its end (ddp_aggregator.h), not once a bucket.
            if cuda_state._agg.verdict_reads != steps:
                mine.append("%s: the payload checks were read %d times in %d steps" % (
                    label, cuda_state._agg.verdict_reads, steps))
        fixed = cuda_state.caps["fixed_size"]
        if fixed and world == 1:
            # DDP's own copies and nothing else: every codec checks its payloads on the device.
            extra = [c - b for c, b in zip(copies, base)]
            if any(e != 0 for e in extra):
                mine.append("%s: %s device-to-host copies per step beyond plain DDP's %s (expected none)"
                            % (label, extra, base))
        verdict = "bit-identical to the host path" if compressor != "powersgd" else (
            "vectors bit-identical, matrices within %.2g of PowerSGD's tolerance" % worst)
        print("rank %d %-13s %d steps: %s; device-to-host copies per step %s (plain DDP %s)" % (
            rank, label, steps, verdict if not mine else "FAILED", copies, base))
        failures += mine
        host_state.close()
        cuda_state.close()
    check(not failures, "\n".join(failures))


def bf16_case(rank, world, backend):
    device = torch.device("cuda", 0)
    model = Exact(SHAPES).to(device)
    ddp, state = hooked(model, None, "bf16", {}, device_ids=[0])
    cs = gradients(0, rank)
    if backend == "gloo":
        expect_error(RuntimeError, "wire dtype bf16 cannot be summed by the 'torch:gloo' communicator",
                     lambda: ddp([c.to(device) for c in cs]).backward())
        print("rank %d bf16 under gloo: refused, naming the communicator" % rank)
        return
    # One rank: the aggregate is the gradient rounded to bf16 (to nearest even, as torch rounds), divided by 1.
    ddp([c.to(device) for c in cs]).backward()
    for i, (p, c) in enumerate(zip(model.ps, cs)):
        check(bits_equal(p.grad.cpu(), c.bfloat16().float()), "bf16 tensor %d: not torch's bf16 rounding" % i)
    state.close()
    print("rank %d bf16 under NCCL: the gradients are torch's bf16 rounding, bit for bit" % rank)


def overlap_case(rank):
    device = torch.device("cuda", 0)
    for compressor, kwargs in (("topk", {"ratio": 0.05, "error_feedback": True}),
                               ("powersgd", {"rank": 2, "error_feedback": True}),
                               ("fp16", {"error_feedback": True})):
        results = []
        ways = [(True, "current"), (False, "current"), (True, "side")]
        if compressor == "fp16":
            ways += [("chain", "current"), ("chain", "side")]  # one round: chained on request (terse/torch.py)
        elif compressor == "powersgd":
            ways += [("chain", "current"), ("chain", "side")]  # two rounds, chained too (compress_deferred)
        for overlap, stream in ways:
            model = Exact(SHAPES).to(device)
            ddp = nn.parallel.DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=BUCKET_MB)
            state = terse.torch.CompressionState(compressor, module=model, overlap=overlap, stream=stream, **kwargs)
            if stream == "side":
                check(state._stream != torch.cuda.current_stream(device), "stream='side' bound torch's current stream")
            first_done = []

            def spy(st, bucket):
                fut = terse.torch.compression_hook(st, bucket)
                if bucket.index() == 0:
                    first_done.append(fut.done())
                return fut
            ddp.register_comm_hook(state, spy)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for step in range(4):
                opt.zero_grad(set_to_none=True)
                ddp([c.to(device) for c in gradients(step, rank)]).backward()
                opt.step()
            torch.cuda.synchronize()
            results.append([p.detach().cpu() for p in model.ps])
            check(len(first_done) == 4, "%s: bucket 0 reached the hook %d times in 4 steps" % (compressor,
                                                                                            len(first_done)))
            chained = overlap == "chain" and compressor in ("fp16", "powersgd")
            check(state._chain is chained, "%s overlap=%r: chained %r" % (compressor, overlap, state._chain))
            if chained:
                # gloo completes a collective on its own thread, which may run the decode before the hook call
                # returns: whether the Future is pending then is a race, so only the bits are checked.
                pass
            elif overlap:
                check(not any(first_done), "%s: the first bucket's Future was complete when the hook returned: %s"
                      % (compressor, first_done))
            else:
                check(all(first_done), "%s: without overlap the Future should be complete: %s" % (compressor,
                                                                                              first_done))
            state.close()
        others = [("the synchronous path", results[1]), ("overlap on a side stream", results[2])]
        labels = ["the chain", "the chain on a side stream"]
        others += list(zip(labels, results[3:]))
        for name, other in others:
            for i, (a, b) in enumerate(zip(results[0], other)):
                check(bits_equal(a, b), "%s: tensor %d differs between overlap and %s" % (compressor, i, name))
        print("rank %d overlap %s: the first bucket's Future was pending each step; parameters bit-identical with and "
              "without overlap and on a side stream" % (rank, compressor))


def local_sgd_case(rank, cpu_group):
    device = torch.device("cuda", 0)
    for compressor, kwargs, start, atol in (("none", {}, 2, 1e-6),
                                            ("topk", {"ratio": 0.05, "error_feedback": True}, 0, 1e-5),
                                            ("powersgd", {"rank": 2, "error_feedback": True}, 0, 1e-3)):
        runs = []
        for where, group in ((device, None), (torch.device("cpu"), cpu_group)):
            model = Exact(SHAPES).to(where)
            ddp = nn.parallel.DistributedDataParallel(model, device_ids=[0] if where.type == "cuda" else None,
                                                      process_group=group, bucket_cap_mb=BUCKET_MB)
            state = terse.torch.CompressionState(compressor, module=model, process_group=group, **kwargs)
            local = terse.torch.LocalSGD(state, model, period=2, start_step=start)
            ddp.register_comm_hook(local, terse.torch.local_sgd_hook)
            opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            agreed = []
            for step in range(6):
                opt.zero_grad(set_to_none=True)
                ddp([c.to(where) for c in gradients(step, rank)]).backward()
                opt.step()
                averaged = local.step()
                flat = torch.cat([p.detach().reshape(-1).cpu() for p in model.ps])
                every = [torch.empty_like(flat) for _ in range(2)]
                dist.all_gather(every, flat, group=cpu_group)
                agreed.append((averaged, torch.equal(every[0], every[1])))
            state.close()
            runs.append(([p.detach().cpu() for p in model.ps], agreed, where))
        for params, agreed, where in runs:
            for step, (averaged, same) in enumerate(agreed, start=1):
                synced = step <= start or averaged
                check(same == synced, "%s on %s, step %d: replicas agree %s, averaged %s" % (compressor, where, step,
                                                                                            same, averaged))
        for i, (a, b) in enumerate(zip(runs[0][0], runs[1][0])):
            check(torch.allclose(a, b, rtol=0, atol=atol),
                  "%s: tensor %d differs between the GPU and the CPU by %g" % (compressor, i, (a - b).abs().max()))
        print("rank %d local_sgd %s: replicas agree after each averaging on the GPU; GPU and CPU within %g"
              % (rank, compressor, atol))


def refusals(rank, fixture_plugins):
    device = torch.device("cuda", 0)
    State = terse.torch.CompressionState
    # test_throws is host-only: refused at construction, naming it, before DDP or any collective.
    expect_error(terse.Unsupported, "compressor 'test_throws'",
                 lambda: State("test_throws", plugin_path=[fixture_plugins], module=Exact(SHAPES).to(device)))
    # A state bound to cuda:0 refuses a CPU bucket, naming both devices.
    state = State("none", module=Exact(SHAPES).to(device), overlap=False)
    cpu_model = Exact(SHAPES)
    ddp = nn.parallel.DistributedDataParallel(cpu_model, bucket_cap_mb=BUCKET_MB)
    ddp.register_comm_hook(state, terse.torch.compression_hook)
    expect_error(RuntimeError, "and this state aggregates the gradients of cuda:0",
                 lambda: ddp(gradients(0, rank)).backward())
    print("rank %d refusals: host-only plugin, CPU bucket on a CUDA state" % rank)


def nccl_refuses_cpu(rank):
    # Under an NCCL group a CPU model is refused at construction, naming the backend.
    expect_error(terse.Unsupported, "backend is 'nccl'",
                 lambda: terse.torch.CompressionState("none", module=Exact(SHAPES)))
    print("rank %d refusals: a CPU model under NCCL" % rank)


def _run(rank, case, world, backend, store, args):
    _import_terse()  # a spawned process imports this file afresh
    torch.set_num_threads(1)
    torch.cuda.set_device(0)
    dist.init_process_group(backend, init_method="file://" + store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=120))
    try:
        if case in ("bits_nccl", "bits_gloo2"):
            cpu_group = dist.new_group(backend="gloo")
            bits(rank, world, cpu_group)
            bf16_case(rank, world, backend)
        elif case == "overlap":
            overlap_case(rank)
        elif case == "local_sgd":
            local_sgd_case(rank, dist.new_group(backend="gloo"))
        elif case == "refusals":
            if backend == "nccl":
                nccl_refuses_cpu(rank)
            else:
                refusals(rank, args.fixture_plugins)
    finally:
        dist.destroy_process_group()


def _import_terse():
    global terse
    import terse.torch  # noqa: F401  (binds the package to the module's name `terse`)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["bits_nccl", "bits_gloo2", "overlap", "local_sgd", "refusals"])
    p.add_argument("--fixture-plugins", required=True, help="the directory of terse_compressor_test_throws")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("skipped: torch %s sees no CUDA device" % torch.__version__)
        return SKIP
    _import_terse()
    runs = {"bits_nccl": [("nccl", 1)], "bits_gloo2": [("gloo", 2)], "overlap": [("gloo", 2)],
            "local_sgd": [("gloo", 2)],
            "refusals": [("gloo", 1), ("nccl", 1)]}[args.case]
    for backend, world in runs:
        with tempfile.TemporaryDirectory() as tmp:
            mp.spawn(_run, args=(args.case, world, backend, os.path.join(tmp, "store"), args), nprocs=world)
    print("ok: %s" % args.case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
