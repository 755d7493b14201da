#!/usr/bin/env python3
"""terse.torch.ddp_hook end to end: 2 DDP processes (torch.multiprocessing, gloo, CPU), one ctest case per
subcommand (tests/python/CMakeLists.txt):

  equivalence       the `none` hook and DDP's built-in allreduce give bit-identical parameters after 12 steps
  payload_bytes     each bucket's payload bytes equal `terse plugins show` for its tensors (tensor granularity) or
                    its size (bucket granularity), for top-k, fp16, 1-bit and PowerSGD (two rounds)
  errors            a missing plugin, a bad parameter, a plugin that throws in compress and a bf16 SUM wire that gloo
                    cannot sum raise terse's exceptions with terse's messages, and the job shuts down
  one_rank_fails    a plugin failing on rank 0 only: rank 0 raises terse's error, rank 1 is released by gloo (no hang)
  layout            a bucket that changes size (bucket granularity: new pipeline; tensor granularity: refused), a
                    layout that does not tile the bucket, and a re-formed group of another size are handled or refused
  accuracy          top-k 1% + EF + DGC momentum through the hook on the quickstart MLP (tests/python/
                    ddp_recipe.textproto) ends within 1 point of `terse run` of the same recipe, and `terse compare`
                    shows both runs in one table
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import terse
import terse.torch

WORLD = 2
ARGS = None  # the command line, set in main (spawned workers get it as an argument)


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def expect_error(kind, fragment, fn):
    """fn() must raise `kind` whose message contains `fragment`; returns the message."""
    try:
        fn()
    except kind as e:
        check(fragment in str(e), "%s raised %s without %r in its message: %s" % (fn, kind.__name__, fragment, e))
        return str(e)
    raise AssertionError("%s did not raise %s (%r)" % (fn, kind.__name__, fragment))


def mlp(seed=1):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def batch(step, rank, n=32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g)


def train_steps(ddp, opt, steps, rank):
    for s in range(steps):
        x, y = batch(s, rank)
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()


def spawn(fn, *extra, timeout_s=60):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_run, args=(fn, os.path.join(tmp, "store"), timeout_s, ARGS) + extra, nprocs=WORLD)


def _run(rank, fn, store, timeout_s, args, *extra):
    global ARGS
    ARGS = args
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=WORLD,
                            timeout=timedelta(seconds=timeout_s))
    try:
        fn(rank, *extra)
    finally:
        dist.destroy_process_group()


# ---- equivalence


def equivalence(rank):
    # Bit-identical, not just within rounding: DDP's default path scales each gradient by 1/2 before its allreduce and
    # the hook divides the sum by 2 after it; with two ranks the gloo sum is a + b either way (addition commutes) and
    # scaling by a power of two is exact, so (a + b) / 2 == a / 2 + b / 2 bit for bit. `none` hands the gradient over
    # unchanged (a SUM of f32), so any difference would be the hook's.
    ref, ours = mlp(), mlp()
    ddp_ref = nn.parallel.DistributedDataParallel(ref)
    ddp_ours = nn.parallel.DistributedDataParallel(ours)
    state, hook = terse.torch.ddp_hook("none", module=ours)
    ddp_ours.register_comm_hook(state, hook)
    train_steps(ddp_ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), 12, rank)
    train_steps(ddp_ours, torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9), 12, rank)
    for (name, a), b in zip(ref.named_parameters(), ours.parameters()):
        check(torch.equal(a, b), "rank %d: %s differs from DDP's allreduce by up to %g" % (rank, name,
                                                                                         (a - b).abs().max()))
    check(state.step == 12, "the hook counted %d steps, expected 12" % state.step)


# ---- payload bytes


CASES = [("topk", {"ratio": "0.01"}), ("fp16", {}), ("onebit", {}), ("powersgd", {"rank": "2"})]


def payload_bytes(rank, out_path):
    found = []
    for name, params in CASES:
        for granularity in ("tensor", "bucket"):
            # DDP puts everything in one bucket for the first step and re-forms its buckets from then on, the first
            # one (the last layers) closing once it holds dist._DEFAULT_FIRST_BUCKET_BYTES (a documented knob): 64 KB
            # cuts the MLP after fc1, so two bucket sizes are checked.
            dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024
            model = mlp()
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
            state, hook = terse.torch.ddp_hook(name, params=params, module=model, granularity=granularity,
                                               error_feedback=name != "fp16")
            ddp.register_comm_hook(state, hook)
            # Two steps: DDP re-forms its buckets after the first; the second step's buckets are the ones checked.
            train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.01), 2, rank)
            for index, b in state.buckets().items():
                found.append({"compressor": name, "params": params, "granularity": granularity, "index": index,
                              "numel": b["numel"], "payload": b["last_step"]["payload"],
                              "wire_sent": b["last_step"]["wire_sent"]})
            # Tensor granularity: every parameter is its own tensor, so one step's payload is the tensors' sum.
            if granularity == "tensor":
                found.append({"compressor": name, "tensor_shapes": [list(p.shape) for p in model.parameters()],
                              "params": params, "total_payload": state.totals()["payload"], "steps": state.step})
    if rank == 0:
        with open(out_path, "w") as f:
            json.dump(found, f)


def show_payload(name, params, numel=None, shape=None):
    """`terse plugins show`'s exact payload bytes (all rounds) for one f32 tensor."""
    cmd = [ARGS.terse, "plugins", "show", name]
    for k, v in params.items():
        cmd += ["--param", "%s=%s" % (k, v)]
    cmd += ["--numel", str(numel)] if shape is None else ["--shape", "x".join(str(d) for d in shape)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    rows = re.findall(r"^\s+(\d+|all)\s+(\d+)\s+(\d+)\s", out, re.M)
    check(rows, "no payload table in `%s`:\n%s" % (" ".join(cmd), out))
    return int(rows[-1][2])  # the last row: "all" for several rounds, round 0 otherwise


def check_payload_bytes(path):
    records = json.load(open(path))
    checked = 0
    for r in records:
        if "tensor_shapes" in r:
            # Every tensor once per step: the sum over all buckets of the last step equals the sum of the tensors.
            want = sum(show_payload(r["compressor"], r["params"], shape=s) for s in r["tensor_shapes"])
            got = sum(x["payload"] for x in records if x.get("compressor") == r["compressor"]
                      and x.get("granularity") == "tensor" and "index" in x)
            check(got == want, "%s per tensor: the hook's payload of one step is %d B, `terse plugins show` "
                  "says %d B" % (r["compressor"], got, want))
            checked += 1
        elif r["granularity"] == "bucket":
            want = show_payload(r["compressor"], r["params"], numel=r["numel"])
            check(r["payload"] == want, "%s bucket %d (%d elements): the hook produced %d B, `terse plugins show` "
                  "says %d B" % (r["compressor"], r["index"], r["numel"], r["payload"], want))
            # Two ranks: an all-gather sends the one other rank our payload; a ring allreduce sends 2(n-1)/n of the
            # summed body, which is the payload without the compressor's summed-header bytes.
            check(r["wire_sent"] <= r["payload"], "%s: wire %d B above payload %d B" % (r["compressor"],
                                                                                       r["wire_sent"], r["payload"]))
            checked += 1
    buckets = {(r["compressor"], r["numel"]) for r in records if r.get("granularity") == "bucket"}
    check(len(buckets) >= 2 * len(CASES), "expected several bucket sizes per compressor, got %s" % sorted(buckets))
    print("payload bytes: %d checks against `terse plugins show`, bucket sizes %s" % (
        checked, sorted({n for _, n in buckets})))


# ---- errors


def errors(rank):
    expect_error(terse.PluginError, "compressor 'no_such_compressor' not found",
                 lambda: terse.torch.ddp_hook("no_such_compressor"))
    expect_error(terse.InvalidArgument, "topk: 'ratio' must be in (0, 1], got 2",
                 lambda: terse.torch.ddp_hook("topk", params={"ratio": "2"}))
    expect_error(terse.InvalidArgument, "'momentum_correction' must be in [0, 1)",
                 lambda: terse.torch.ddp_hook("none", momentum_correction=1.5))
    expect_error(terse.InvalidArgument, "granularity must be 'tensor' or 'bucket'",
                 lambda: terse.torch.ddp_hook("none", granularity="layer"))
    check(issubclass(terse.InvalidArgument, ValueError), "terse.InvalidArgument should be a ValueError")

    # A plugin that throws in compress: every rank raises out of backward before the collective, so none waits.
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state, hook = terse.torch.ddp_hook("test_throws", plugin_path=[ARGS.fixture_plugins], module=model)
    ddp.register_comm_hook(state, hook)
    x, y = batch(0, rank)
    expect_error(RuntimeError, "deliberate failure in compress", lambda: F.cross_entropy(ddp(x), y).backward())
    check(isinstance(state.error, terse.PluginError), "state.error is %r" % (state.error,))

    # A SUM compressor whose wire dtype gloo cannot sum: core's pipeline validation refuses it when the bucket is
    # first bound, with core's message naming the communicator.
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state, hook = terse.torch.ddp_hook("bf16", module=model)
    ddp.register_comm_hook(state, hook)
    expect_error(RuntimeError, "wire dtype bf16 cannot be summed by the 'torch:gloo' communicator",
                 lambda: F.cross_entropy(ddp(x), y).backward())
    # The job can still shut down cleanly (the finally of _run destroys the group).


def one_rank_fails(rank, marker_dir):
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state, hook = terse.torch.ddp_hook("fail_at_step", params={"fail_step": "2", "fail_rank": "0"},
                                       plugin_path=[ARGS.runner_plugins], module=model)
    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        train_steps(ddp, opt, 4, rank)
    except Exception as e:  # noqa: BLE001  (rank 1 sees gloo's error, whatever its type)
        with open(os.path.join(marker_dir, "rank%d" % rank), "w") as f:
            f.write("%s: %s" % (type(e).__name__, e))
        if rank == 0:
            # Leaving releases the peer: gloo fails its pending collective when our connections close.
            dist.destroy_process_group()
            os._exit(0)
        return
    raise AssertionError("rank %d trained through a plugin that fails on rank 0" % rank)


# ---- layout


class FakeBucket:
    """What the hook reads of a DDP GradBucket, to drive layouts DDP itself would not produce."""

    def __init__(self, index, params, offsets=None):
        self.params = params
        total = sum(p.numel() for p in params)
        self.buf = torch.randn(total)
        self.offsets = offsets or [sum(p.numel() for p in params[:i]) for i in range(len(params))]
        self._index = index

    def buffer(self):
        return self.buf

    def index(self):
        return self._index

    def is_last(self):
        return True

    def parameters(self):
        return self.params

    def gradients(self):
        return [self.buf[o:o + p.numel()].view(p.shape) for o, p in zip(self.offsets, self.params)]


def layout(rank, store2):
    hook_fn = terse.torch._hook
    # Bucket granularity: a bucket that grows gets a new pipeline and goes on.
    state, _ = terse.torch.ddp_hook("topk", params={"ratio": "0.1"}, granularity="bucket", error_feedback=True)
    a = [torch.zeros(10, 10)]
    hook_fn(state, FakeBucket(0, a)).wait()
    hook_fn(state, FakeBucket(0, a + [torch.zeros(20)])).wait()
    check(state.buckets()[0]["numel"] == 120, "bucket 0 should now hold 120 elements: %s" % state.buckets())
    # Tensor granularity: the same parameter object with another shape is refused, naming the shapes.
    state, _ = terse.torch.ddp_hook("topk", params={"ratio": "0.1"})
    p = torch.zeros(10, 10)
    hook_fn(state, FakeBucket(0, [p])).wait()
    p.data = torch.zeros(5, 10)
    expect_error(terse.InvalidArgument, "was bound as f32 [10, 10] and is now f32 [5, 10]",
                 lambda: hook_fn(state, FakeBucket(0, [p])))
    # A layout that leaves a gap in the bucket is refused before any collective.
    q, r = torch.zeros(10), torch.zeros(10)
    bad = FakeBucket(1, [q, r], offsets=[0, 0])
    expect_error(terse.InvalidArgument, "must tile its buffer", lambda: hook_fn(state, bad))
    # A re-formed default group of another size: the hook says it needs rebuilding.
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method="file://%s.%d" % (store2, rank), rank=0, world_size=1)
    expect_error(terse.InvalidArgument, "built for rank %d of a process group of 2, the group is now rank 0 of 1" % rank,
                 lambda: hook_fn(state, FakeBucket(0, [torch.zeros(10, 10)])))


# ---- accuracy against the native run


def accuracy(out):
    cfg = os.path.join(ARGS.source, "tests", "python", "ddp_recipe.textproto")
    variant = "topk-1pct-ef"
    subprocess.run([ARGS.terse, "run", cfg, "--variant", variant, "--out", out], check=True,
                   stdout=subprocess.DEVNULL)
    example = os.path.join(ARGS.source, "experiments", "pytorch", "train_fashion_mnist.py")
    subprocess.run([sys.executable, example, "--config", cfg, "--variant", variant, "--name", "torch-" + variant,
                    "--results", out], check=True, stdout=subprocess.DEVNULL)

    def final(name):
        lines = open(os.path.join(out, "ddp_hook", name, "metrics.jsonl")).read().splitlines()
        return json.loads(lines[-1])

    native, ours = final(variant), final("torch-" + variant)
    check(abs(native["test_accuracy"] - ours["test_accuracy"]) <= 0.01,
          "PyTorch + hook ended at %.4f, terse run at %.4f: more than 1 point apart" % (ours["test_accuracy"],
                                                                                      native["test_accuracy"]))
    check(native["step"] == ours["step"], "steps differ: native %d, hook %d" % (native["step"], ours["step"]))
    table = subprocess.run([ARGS.terse, "compare", os.path.join(out, "ddp_hook"), "--format", "csv"], check=True,
                           capture_output=True, text=True).stdout
    rows = {line.split(",")[1] for line in table.splitlines() if "," in line}
    check({variant, "torch-" + variant} <= rows, "`terse compare` does not list both runs:\n%s" % table)
    print("accuracy: terse run %.4f, PyTorch + hook %.4f (%d steps); payload per worker %d vs %d B" % (
        native["test_accuracy"], ours["test_accuracy"], ours["step"], native["payload_bytes_per_worker"],
        ours["payload_bytes_per_worker"]))


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["equivalence", "payload_bytes", "errors", "one_rank_fails", "layout", "accuracy"])
    p.add_argument("--terse", required=True, help="the terse binary")
    p.add_argument("--source", required=True, help="the source tree")
    p.add_argument("--fixture-plugins", required=True)
    p.add_argument("--runner-plugins", required=True)
    ARGS = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if ARGS.case == "equivalence":
            spawn(equivalence)
        elif ARGS.case == "payload_bytes":
            path = os.path.join(tmp, "payload.json")
            spawn(payload_bytes, path)
            check_payload_bytes(path)
        elif ARGS.case == "errors":
            spawn(errors)
        elif ARGS.case == "one_rank_fails":
            spawn_failing(tmp)
        elif ARGS.case == "layout":
            spawn(layout, os.path.join(tmp, "store2"))
        else:
            accuracy(tmp)
    print("%s: ok" % ARGS.case)


def spawn_failing(tmp):
    # Short group timeout: if gloo did not release rank 1, the test fails in 20 s instead of hanging.
    try:
        spawn(one_rank_fails, tmp, timeout_s=20)
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        raise
    r0 = open(os.path.join(tmp, "rank0")).read()
    r1 = open(os.path.join(tmp, "rank1")).read()
    # Out of backward, autograd re-raises the hook's exception as a RuntimeError that names it and keeps its message.
    check("PluginError" in r0 and "fail_at_step: failing on purpose at step 2" in r0, "rank 0 raised %s" % r0)
    print("one rank fails: rank 0: %s\n  rank 1: %s" % (r0[:160], r1[:160]))


if __name__ == "__main__":
    main()
