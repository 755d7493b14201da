#!/usr/bin/env python3
"""terse.torch's DDP hook (CompressionState + compression_hook) and ResultsLogger end to end: 2 DDP processes
(torch.multiprocessing, gloo, CPU), one ctest case per subcommand (tests/python/CMakeLists.txt):

  equivalence       the `none` hook and DDP's built-in allreduce give bit-identical parameters after 12 steps, with
                    the hook overlapping backward and without
  overlap           on a model of several buckets, the first bucket's Future is not complete when the hook returns;
                    fp16 (chained on asynchronous collectives), top-k + EF (the worker thread) and PowerSGD (the
                    worker, and with overlap="chain" chained round by round) give the same parameters bit for bit
                    with overlap and without; a failure on the worker
                    reaches DDP as an error naming terse's exception, and fails the buckets queued behind it without a
                    collective; a chained bucket's failure is raised by the hook call itself
  api               typed keyword values (ratio=0.01, unbiased=True) become the plugin's parameters; values of other
                    types, non-bool flags, bad seeds, a parameter given twice, a module= that is no module and a
                    module off the CPU are refused with terse.InvalidArgument / terse.Unsupported naming the value
  logger            ResultsLogger writes the folder `terse run` writes, for a hook run and for a plain-DDP baseline
                    (bytes from the module, steps from the caller), and `terse compare` lists both; study and
                    variant names that are no folder names are refused before anything is written; record() after
                    finish() is refused, a second finish() changes nothing; DGC's masking and Nesterov are in the
                    config and the granularity in provenance.json, which `terse compare --provenance` shows
  payload_bytes     each bucket's payload bytes equal `terse plugins show` for its tensors (tensor granularity) or
                    its size (bucket granularity), for top-k, fp16, 1-bit and PowerSGD (two rounds)
  errors            a missing plugin (its message names plugin_path=, not the CLI's flag, and lists the compressors
                    found), a plugin_path= entry that is no folder, a bad parameter, a plugin that throws in compress
                    and a bf16 SUM wire that gloo cannot sum raise terse's exceptions with terse's messages (out of
                    backward: a RuntimeError naming them), and the job shuts down
  one_rank_fails    a plugin failing on rank 0 only: rank 0 raises terse's error, rank 1 is released by gloo (no hang)
  plugin_hangs      a plugin whose compress hangs on rank 0 (plugin_timeout 2 s): on the worker thread
                    (overlap="thread") rank 0's backward raises terse's PluginError naming the plugin, the call and the
                    tensor within the deadline and a margin; chained (overlap=True: the plugin is SUM) and
                    without overlap the hung call holds backward's thread, so the process exits 1, naming it; rank 1
                    is released by gloo
  layout            a bucket that changes size (bucket granularity: new pipeline, said once at info level in the
                    second step, where DDP re-forms its buckets, and a warning at any other; tensor granularity:
                    refused), a layout that does not tile the bucket, and a re-formed group of another size are
                    handled or refused
  step_trace        step_trace=True with a logger: every rank's steps.rank<R>.jsonl in the results folder, each step
                    with a forward segment per Linear (its parameters that layer's tensors), a backward segment and a
                    group per DDP bucket (same tensors, in order; compress, gloo all-gathers, decompress), the
                    optimizer's time as updates; the parameters equal an untraced run's bit for bit; `terse whatif`
                    replays the folder at 16 workers; step_trace without module= is refused
  accuracy          top-k 1% + EF + DGC momentum through the hook, and local SGD every 8 steps through
                    terse.torch.LocalSGD, on the quickstart MLP (tests/python/ddp_recipe.textproto, by
                    experiments/pytorch/train_fashion_mnist.py) each end within 1 point of `terse run` of the same
                    recipe; local SGD sends the same payload bytes on both sides (49 averagings); `terse compare`
                    shows every run in one table
  chained_order     3 ranks handing buckets over after rank-dependent delays: the chained rounds (overlap="chain") of
                    two-round SUM compressors (test_rounds, PowerSGD + EF) are issued in one order on every rank (no
                    gloo abort or timeout), and the parameters equal the unchained run's bit for bit; a round that
                    fails between two rounds (on gloo's thread) fails backward with terse's error and completes every
                    Future
  settle_later      3 ranks, chained buckets finished in rank-dependent orders, their payload checks read once a step as
                    on CUDA (the device's bookkeeping run on the host): fp16 and PowerSGD + EF read every step's once
                    and equal the unchained run bit for bit; a failing decode fails backward and stops the hook. Then
                    one rank driving the aggregator's chained calls in named orders: no read before a step's last
                    finish and one after, a bucket begun again before its step ended, round-returning finishes, a step
                    whose every finish fails
  provenance        one process, no DDP: what a run records of its code. terse.Recipe names a module given relative
                    to the config by its canonical path wherever it is run from; ResultsLogger hashes the module and
                    every file of its folder it imported (a sibling, a package), not a working directory's file of the
                    module's name, and says a relative module in a hand-written description is not hashed;
                    torchvision's version once imported; the driver's check forward (terse.train.check_fit) leaves
                    Python's, numpy's and torch's random state as it found it
  variable_size     threshold (a payload whose size varies by rank), with and without error feedback, over buckets
                    whose payloads differ between the ranks every step (the communicator's padded all-gather): the
                    averaged gradients equal a reference computed in torch bit for bit
"""

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import traceback
import types
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import terse
import terse.torch

from checks import check, expect_error, expect_terse_error  # tests/python/checks.py, beside this file
from exact import Exact, exact_gradients  # tests/python/exact.py

WORLD = 2
ARGS = None  # the command line, set in main (spawned workers get it as an argument)


def mlp(seed=1):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def batch(step, rank, n=32):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 784, generator=g), torch.randint(0, 10, (n,), generator=g)


def train_steps(ddp, opt, steps, rank):
    for s in range(steps):
        train_step(ddp, opt, s, rank)


def keeping_futures(ddp, state):
    """Registers terse's hook on `ddp`, keeping the Futures it hands DDP in the list returned."""
    futures = []

    def keep(state, bucket):  # DDP checks a hook's parameter names
        futures.append(terse.torch.compression_hook(state, bucket))
        return futures[-1]

    ddp.register_comm_hook(state, keep)
    return futures


def check_all_done(futures, what, timeout_s=10):
    """Every Future in `futures` completes within timeout_s (a failure must leave none behind)."""
    deadline = time.monotonic() + timeout_s
    while not all(f.done() for f in futures) and time.monotonic() < deadline:
        time.sleep(0.01)
    check(futures and all(f.done() for f in futures), "%s: %d of %d Futures complete %d s after the failure"
          % (what, sum(f.done() for f in futures), len(futures), timeout_s))


def spawn(fn, *extra, timeout_s=60, world=WORLD):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_run, args=(fn, os.path.join(tmp, "store"), timeout_s, world, ARGS) + extra, nprocs=world)


def _run(rank, fn, store, timeout_s, world, args, *extra):
    global ARGS
    ARGS = args
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
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
    ref = mlp()
    ddp_ref = nn.parallel.DistributedDataParallel(ref)
    train_steps(ddp_ref, torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9), 12, rank)
    for overlap in (True, False):
        ours = mlp()
        ddp_ours = nn.parallel.DistributedDataParallel(ours)
        state = terse.torch.CompressionState("none", module=ours, overlap=overlap)
        ddp_ours.register_comm_hook(state, terse.torch.compression_hook)
        train_steps(ddp_ours, torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9), 12, rank)
        for (name, a), b in zip(ref.named_parameters(), ours.parameters()):
            check(torch.equal(a, b), "rank %d, overlap=%s: %s differs from DDP's allreduce by up to %g"
                  % (rank, overlap, name, (a - b).abs().max()))
        check(state.step == 12, "the hook counted %d steps, expected 12" % state.step)


# ---- the dense warm-up (compression_start_step)


def dense_warmup(rank, root):
    # compression_start_step=K, as torch's start_powerSGD_iter: the first K backward passes are DDP's own allreduce bit
    # for bit (two ranks: see `equivalence`) on every path -- chained, on the worker thread, inside the hook, and with a
    # step trace, which takes pipelines of `none` instead of the in-place sum -- and PowerSGD takes over at pass K:
    # the parameters leave the reference there, and the payload is K dense passes' plus PowerSGD's own after them.
    # Several buckets (bucket_cap_mb), which DDP re-forms after its first pass, inside the warm-up; chained, they may
    # finish in any order under gloo, the switch falling between two passes all the same.
    K = 3
    ref = mlp()
    ddp_ref = nn.parallel.DistributedDataParallel(ref)
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1, momentum=0.9)
    want = []
    for s in range(K + 2):
        train_step(ddp_ref, opt_ref, s, rank)
        want.append([p.detach().clone() for p in ref.parameters()])
    numel = sum(p.numel() for p in ref.parameters())
    tensors = len(list(ref.parameters()))
    plain = terse.torch.CompressionState("powersgd", rank=2, error_feedback=True, module=mlp())
    check(not plain._agg.warming_up, "a state without compression_start_step is warming up")
    for overlap, traced in ((True, False), ("chain", False), ("thread", False), (False, False), (True, True)):
        dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024  # as payload_bytes: torch 2.x caps the first with bucket_cap_mb
        ours = mlp()
        ddp = nn.parallel.DistributedDataParallel(ours, bucket_cap_mb=0.25)
        state = terse.torch.CompressionState("powersgd", rank=2, error_feedback=True, module=ours, overlap=overlap,
                                             compression_start_step=K, step_trace=traced)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        log = terse.torch.ResultsLogger(root, study="warm", variant="%s-%s" % (overlap, traced), state=state) \
            if traced else None
        opt = torch.optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
        what = "rank %d, overlap=%s, traced=%s" % (rank, overlap, traced)
        encode_s = 0.0
        for s in range(K + 2):
            check(state._agg.warming_up == (s < K), "%s: pass %d warming up is %s" % (what, s, state._agg.warming_up))
            train_step(ddp, opt, s, rank)
            # Codec seconds only grow: the warm-up's pipelines, dropped at pass K, leave theirs counted.
            now = state.times()["encode_s"]
            check(now >= encode_s, "%s: encode seconds fell from %g to %g at pass %d" % (what, encode_s, now, s))
            encode_s = now
            same = all(torch.equal(a, b) for a, b in zip(want[s], ours.parameters()))
            if s < K:
                check(same, "%s: pass %d of the warm-up differs from DDP's allreduce" % (what, s))
                # In place the body alone; traced, through `none`'s pipelines, with a header a tensor.
                payload = state.totals()["payload"]
                body = (s + 1) * numel * 4
                check(payload == body if not traced else body < payload <= body + (s + 1) * 64 * tensors,
                      "%s: %d payload bytes after %d dense passes of %d elements" % (what, payload, s + 1, numel))
                dense = payload
            else:
                check(not same, "%s: pass %d equals DDP's allreduce: PowerSGD did not take over" % (what, s))
        compressed = state.totals()["payload"] - dense
        check(0 < compressed < numel * 4, "%s: PowerSGD's two passes sent %d bytes" % (what, compressed))
        check(len(state.buckets()) > 1, "%s: DDP made %d buckets" % (what, len(state.buckets())))
        if log is not None:
            log.record(test_accuracy=0.5)
            log.finish()
            if rank == 0:
                # As a native run: the config says where the warm-up ended, the provenance which plugin ran it.
                folder = os.path.join(root, "warm", "%s-%s" % (overlap, traced))
                check("compression_start_step: 3" in open(os.path.join(folder, "config.textproto")).read(),
                      "%s: the results' config has no compression_start_step" % what)
                plugins = json.load(open(os.path.join(folder, "provenance.json")))["plugins"]
                check([(p["name"], p.get("role")) for p in plugins] == [("powersgd", None), ("none", "dense_warmup")],
                      "%s: provenance plugins %s" % (what, plugins))
                # The step trace's header too, so that `terse whatif` sets the warm-up's steps aside.
                header = json.loads(open(os.path.join(folder, "steps.rank0.jsonl")).readline())
                check(header.get("compression_start_step") == 3, "%s: the trace's header %s" % (what, header))
        state.close()
    # What the compressor refuses is refused at the warm-up's first bucket (no module= shows the dtype here), on every
    # rank before any collective, not at pass K.
    doubles = mlp().double()
    ddp = nn.parallel.DistributedDataParallel(doubles)
    state = terse.torch.CompressionState("topk", ratio=0.1, compression_start_step=K)
    ddp.register_comm_hook(state, terse.torch.compression_hook)
    x, y = batch(0, rank)
    expect_terse_error(terse.Unsupported, "topk: only f32 gradients are supported, got f64",
                       lambda: F.cross_entropy(ddp(x.double()), y).backward())
    state.close()
    # The driver's warning for a warm-up as long as the run (terse/train.py) is the native runner's.
    if rank == 0:
        cfg = os.path.join(root, "warm.textproto")
        with open(cfg, "w") as f:
            f.write('study: "w"\nworkload { name: "mlp" }\ncompressor { name: "powersgd" }\n'
                    'error_feedback: true\ncompression_start_step: 50\n')
        recipe = terse.Recipe(cfg)
        check(recipe.compression_start_warning(51) == "", "a warning for a run past its warm-up")
        # And the compressor's phases' (terse/phases_v1.h), this config's warm-up to step 50 covering them or not.
        check(recipe.compressor_phases_warning([60, 80], 100) == "", "a phases warning for phases past the warm-up")
        check(recipe.compressor_phases_warning([2, 4], 100).startswith(
            "compressor 'powersgd' changes its work per step until step 4 (its phases, e.g. dgc's warm-up), and "
            "compression_start_step 50"), "the phases warning: %r" % recipe.compressor_phases_warning([2, 4], 100))
        warning = recipe.compression_start_warning(50)
        check(warning.startswith("compression_start_step 50 is at or past the run's last step (50 steps): "
                                 "compressor 'powersgd' never runs"), "the warning: %r" % warning)
    # DGC's own warm-up (a plugin parameter, not compression_start_step): the hook hands the plugin each pass's step, so
    # the passes of the first stage (ratio 0.01^(1/3) = 0.215), the second (0.046) and then 0.01 send about 4.6x less
    # each time (the band of a count, [0.8k, 1.3k], is narrower than that). A hook that passed step 0 every time would
    # send the first stage's bytes throughout.
    ours = mlp()
    ddp = nn.parallel.DistributedDataParallel(ours)
    state = terse.torch.CompressionState("dgc", ratio=0.01, warmup_steps=4, warmup_stages=2, error_feedback=True,
                                         momentum_correction=0.9, module=ours, step_trace=True)
    ddp.register_comm_hook(state, terse.torch.compression_hook)
    log = terse.torch.ResultsLogger(root, study="warm", variant="dgc", state=state)
    # Its phases (terse/phases_v1.h), which a traced state's header records for `terse whatif`: stage 1 from pass 2,
    # the warm-up's end at pass 4.
    check(state._agg.phase_steps == [2, 4], "dgc's phases: %s" % state._agg.phase_steps)
    opt = torch.optim.SGD(ours.parameters(), lr=0.1)
    sent, before = [], 0
    for s in range(6):
        train_step(ddp, opt, s, rank)
        sent.append(state.totals()["payload"] - before)
        before = state.totals()["payload"]
    check(sent[1] > 2 * sent[2] and sent[3] > 2 * sent[4], "dgc's warm-up: bytes a pass %s" % sent)
    for first in (0, 2, 4):  # the two passes of a stage, and the two after the warm-up, within the band's spread
        pair = sent[first:first + 2]
        check(max(pair) <= 1.3 / 0.8 * min(pair), "dgc's passes %d-%d: bytes a pass %s" % (first, first + 1, sent))
    log.record(test_accuracy=0.5)
    log.finish()
    if rank == 0:
        # The trace's header says where the compressor's own warm-up ends, so that `terse whatif` sets it aside.
        header = json.loads(open(os.path.join(root, "warm", "dgc", "steps.rank0.jsonl")).readline())
        check(header.get("compressor_phases_end") == 4, "dgc's trace header %s" % header)
    state.close()
    print("rank %d dense_warmup: %d dense passes equal to DDP's allreduce on every path, then PowerSGD; dgc's warm-up "
          "sent %s bytes a pass" % (rank, K, sent))


def train_step(ddp, opt, step, rank):
    """The `step`-th step of train_steps."""
    x, y = batch(step, rank)
    opt.zero_grad()
    F.cross_entropy(ddp(x), y).backward()
    opt.step()


# ---- variable-size payloads (the padded all-gather)


# Unequal magnitudes per rank: the two ranks send different numbers of elements, so every all-gather has unequal
# blocks. Several buckets (variable_size's bucket_cap_mb).
VARIABLE_SHAPES = [(40, 30), (301,), (7, 5, 3, 3), (1000,)]


def variable_gradients(step, rank):
    return exact_gradients(VARIABLE_SHAPES, step, rank, spread=2, rank_scale=1)


def variable_size(rank):
    # threshold's payload size is its count of |g| >= tau, different on each rank: the engine all-gathers the sizes,
    # then the payloads through the communicator's padded scratch (torch.distributed's all_gather takes equal blocks).
    # The reference is the textbook rule in torch: with error feedback x = g + e, sent = x where |x| >= tau, e = x -
    # sent; the aggregate is (sent_0 + sent_1) / 2 -- exact sums of disjoint or two terms, so compared bit for bit.
    # EF21 (error_feedback_rule="ef21", core/compress/ef21.h): x = g - h, h = h + sent, and the hook returns the mean
    # of the estimates, (H + (sent_0 + sent_1)) / 2 with H their running sum, in the engine's order of additions.
    tau = 2.0
    for rule in (None, "ef", "ef21"):
        error_feedback = rule is not None
        model = Exact(VARIABLE_SHAPES)
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.005)  # several buckets
        state = terse.torch.CompressionState("threshold", tau=tau, error_feedback=error_feedback,
                                             error_feedback_rule=rule or "ef", module=model)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        residual = [[torch.zeros(s) for s in VARIABLE_SHAPES] for _ in range(WORLD)]
        estimates = [[torch.zeros(s) for s in VARIABLE_SHAPES] for _ in range(WORLD)]
        total = [torch.zeros(s) for s in VARIABLE_SHAPES]
        sizes = set()
        for step in range(4):
            model.zero_grad(set_to_none=True)
            ddp(variable_gradients(step, rank)).backward()
            sent = []
            for r in range(WORLD):
                sent_r = []
                for i, c in enumerate(variable_gradients(step, r)):
                    x = c - estimates[r][i] if rule == "ef21" else c + residual[r][i] if error_feedback else c
                    kept = torch.where(x.abs() >= tau, x, torch.zeros_like(x))
                    if rule == "ef":
                        residual[r][i] = x - kept
                    elif rule == "ef21":
                        estimates[r][i] = estimates[r][i] + kept
                    sent_r.append(kept)
                sent.append(sent_r)
            for i, p in enumerate(model.ps):
                want = (sent[0][i] + sent[1][i]) / WORLD
                if rule == "ef21":
                    total[i] = total[i] + (sent[0][i] + sent[1][i])
                    want = total[i] / WORLD
                check(torch.equal(p.grad, want), "rank %d, error feedback %s, step %d, tensor %d %s: the hook's "
                      "average differs from the reference by up to %g" % (rank, rule, step, i, tuple(p.shape),
                                                                          (p.grad - want).abs().max()))
            # The payload bytes of this step, per bucket, as both ranks saw them: unequal, or the padded path idled.
            mine = sorted((k, b["last_step"]["payload"]) for k, b in state.buckets().items())
            both = [None] * WORLD
            dist.all_gather_object(both, mine)
            sizes.add(both[0] != both[1])
        check(sizes == {True}, "rank %d, error feedback %s: the ranks' payloads had equal sizes in some step: the "
              "unequal all-gather was not exercised" % (rank, rule))
        state.close()
    print("rank %d variable_size: threshold without error feedback, with EF and with EF21, unequal payloads, "
          "bit-identical to the reference" % rank)


# ---- payload bytes


CASES = [("topk", {"ratio": 0.01}), ("fp16", {}), ("onebit", {}), ("powersgd", {"rank": 2})]


def payload_bytes(rank, out_path):
    found = []
    for name, params in CASES:
        for granularity in ("tensor", "bucket"):
            # DDP puts everything in one bucket for the first step and re-forms its buckets from then on, the first
            # one (the last layers) closing once it holds dist._DEFAULT_FIRST_BUCKET_BYTES (a documented knob): 64 KB
            # cuts the MLP after fc1, so two bucket sizes are checked. bucket_cap_mb stays at its default: given,
            # torch 2.x caps the first bucket with it instead and, at 0.25, keeps the MLP in one bucket.
            dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024
            model = mlp()
            ddp = nn.parallel.DistributedDataParallel(model)
            state = terse.torch.CompressionState(name, module=model, granularity=granularity,
                                                 error_feedback=name != "fp16", **params)
            ddp.register_comm_hook(state, terse.torch.compression_hook)
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
    State = terse.torch.CompressionState
    message = expect_error(terse.PluginError, "compressor 'no_such_compressor' not found",
                           lambda: State("no_such_compressor"))
    # From Python the message names the keyword, not the CLI's flag, and lists what the directories hold.
    check("add a directory with plugin_path= or TERSE_PLUGIN_PATH" in message and "--plugin-path" not in message,
          "the message should name plugin_path=, not --plugin-path: %s" % message)
    check(re.search(r"the compressors there: [a-z0-9_, ]*\btopk\b", message), "no list of compressors: %s" % message)
    # The build tree's extension searches the build tree, and no installation's folder: not one found from python3's
    # executable (/usr/bin/../lib/terse/plugins), which says nothing of where terse is (core/plugin/loader.h).
    check("(install" not in message and "(build tree)" in message, "the folders searched: %s" % message)
    message = expect_error(terse.PluginError, "compressor 'no_such_compressor' not found",
                           lambda: State("no_such_compressor", plugin_path=[ARGS.fixture_plugins]))
    check("%s (plugin_path=)" % ARGS.fixture_plugins in message, "the caller's folder should be labelled plugin_path=: "
          "%s" % message)
    # A folder in plugin_path= that is not one is refused before anything loads, naming it and the keyword; a plugin's
    # file there is named for what it is, and given as the compressor it still loads.
    message = expect_error(terse.InvalidArgument,
                           "plugin folder '/nonexistent/terse' (from plugin_path=) does not exist",
                           lambda: State("none", plugin_path=[ARGS.fixture_plugins, "/nonexistent/terse"]))
    check("--plugin-path" not in message, "the message should name plugin_path=, not --plugin-path: %s" % message)
    good_c = os.path.join(ARGS.fixture_plugins, "terse_compressor_good_c.so")
    expect_error(terse.InvalidArgument, "'%s' (from plugin_path=) is a file, not a folder: give the plugin's file as "
                 "its name" % good_c, lambda: State("none", plugin_path=good_c))
    check(State(good_c).compressor == good_c, "a plugin named by its file should load")
    expect_error(terse.InvalidArgument, "topk: 'ratio' must be in (0, 1], got 2", lambda: State("topk", ratio=2))
    expect_error(terse.InvalidArgument, "'momentum_correction' must be in [0, 1)",
                 lambda: State("none", momentum_correction=1.5))
    expect_error(terse.InvalidArgument, "granularity must be 'tensor' or 'bucket'",
                 lambda: State("none", granularity="layer"))
    check(issubclass(terse.InvalidArgument, ValueError), "terse.InvalidArgument should be a ValueError")

    x, y = batch(0, rank)
    for overlap in (True, False):
        # A plugin that throws in compress: every rank raises out of backward before the collective, so none waits.
        # Out of backward it is terse's PluginError, or torch's RuntimeError naming it and keeping its message
        # (checks.py: expect_terse_error says which torch does which).
        model = mlp()
        ddp = nn.parallel.DistributedDataParallel(model)
        state = State("test_throws", plugin_path=[ARGS.fixture_plugins], module=model, overlap=overlap)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        expect_terse_error(terse.PluginError, "deliberate failure in compress",
                           lambda: F.cross_entropy(ddp(x), y).backward())
        check(isinstance(state.error, terse.PluginError), "state.error is %r" % (state.error,))
        expect_error(terse.PluginError, "deliberate failure in compress", state.raise_if_failed)

        # A SUM compressor whose wire dtype gloo cannot sum: core's pipeline validation refuses it when the bucket
        # is first bound, with core's message naming the communicator.
        model = mlp()
        ddp = nn.parallel.DistributedDataParallel(model)
        state = State("bf16", module=model, overlap=overlap)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        expect_error(RuntimeError, "wire dtype bf16 cannot be summed by the 'torch:gloo' communicator",
                     lambda: F.cross_entropy(ddp(x), y).backward())
    # The job can still shut down cleanly (the finally of _run destroys the group).


def one_rank_fails(rank, marker_dir):
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = terse.torch.CompressionState("fail_at_step", fail_step=2, fail_rank=0, plugin_path=ARGS.runner_plugins,
                                         module=model)
    ddp.register_comm_hook(state, terse.torch.compression_hook)
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


# ---- plugin_hangs


def plugin_hangs(rank, marker_dir, overlap):
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = terse.torch.CompressionState(os.path.join(ARGS.fixture_dir, "terse_compressor_misbehave.so"),
                                         fault="hang", call="compress", rank=0, after=6, plugin_timeout=2.0,
                                         overlap=overlap, module=model)
    ddp.register_comm_hook(state, terse.torch.compression_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        train_steps(ddp, opt, 6, rank)
    except Exception as e:  # noqa: BLE001  (rank 1 sees gloo's error, whatever its type)
        with open(os.path.join(marker_dir, "rank%d" % rank), "w") as f:
            f.write("%.3f %s: %s" % (time.time(), type(e).__name__, e))
        if rank == 0:
            check(state._stuck and isinstance(state.error, terse.PluginError), "rank 0's state: %r" % state.error)
            state.close()  # must not wait for the hung worker
            dist.destroy_process_group()
            os._exit(0)
        return
    raise AssertionError("rank %d trained through a plugin that hangs on rank 0" % rank)


def spawn_hanging(tmp, overlap):
    mark = os.path.join(tmp, "fault-started")
    os.environ["TERSE_MISBEHAVE_MARK"] = mark
    try:
        spawn(plugin_hangs, tmp, overlap, timeout_s=20)
    except Exception as e:  # noqa: BLE001
        if overlap == "thread":
            traceback.print_exc()
            raise
        # Chained or without overlap rank 0 exits 1 from the watchdog (mp.spawn reports it): the expected end.
        check("exited with exit code 1" in str(e) or "exit code 1" in str(e), "rank 0 ended otherwise: %s" % e)
    started = os.stat(mark).st_mtime
    if overlap == "thread":
        r0 = open(os.path.join(tmp, "rank0")).read()
        when, text = r0.split(" ", 1)
        took = float(when) - started
        check("PluginError" in text and "misbehave" in text and "compress of tensor" in text
              and "plugin_timeout 2 s" in text, "rank 0 raised %s" % text)
        # The deadline, the watchdog's look (1/40 of it) and the way back through DDP: about 2.05 s on an idle host;
        # the bound leaves room for a loaded one (two torch processes on 2 busy cores).
        check(took < 6.0, "rank 0's backward raised %.2f s after the hang began (plugin_timeout 2 s)" % took)
        print("plugin hangs (overlap): rank 0 raised %.2f s after the hang began: %s" % (took, text[:200]))
        # Rank 1 is released by gloo when rank 0's connections close. (Without overlap mp.spawn may kill it first,
        # once it sees rank 0 exit 1: then there is nothing to read.)
        r1 = open(os.path.join(tmp, "rank1")).read()
        print("  rank 1: %s" % r1[:200])


# ---- layout


class FakeBucket:
    """What the hook reads of a DDP GradBucket, to drive layouts DDP itself would not produce."""

    def __init__(self, index, params, offsets=None, last=True, fill=None):
        self.params = params
        total = sum(p.numel() for p in params)
        self.buf = torch.randn(total) if fill is None else torch.full((total,), float(fill))
        self.last = last
        self.offsets = offsets or [sum(p.numel() for p in params[:i]) for i in range(len(params))]
        self._index = index

    def buffer(self):
        return self.buf

    def index(self):
        return self._index

    def is_last(self):
        return self.last

    def parameters(self):
        return self.params

    def gradients(self):
        return [self.buf[o:o + p.numel()].view(p.shape) for o, p in zip(self.offsets, self.params)]


def layout(rank, store2):
    # Inside the hook (overlap=False), so that each refusal raises from the call itself.
    hook_fn = terse.torch.compression_hook
    # Bucket granularity: a bucket that grows gets a new pipeline and goes on.
    state = terse.torch.CompressionState("topk", ratio=0.1, granularity="bucket", error_feedback=True, overlap=False)
    a = [torch.zeros(10, 10)]
    hook_fn(state, FakeBucket(0, a)).wait()
    hook_fn(state, FakeBucket(0, a + [torch.zeros(20)])).wait()
    check(state.buckets()[0]["numel"] == 120, "bucket 0 should now hold 120 elements: %s" % state.buckets())
    rebuild_log(hook_fn)
    # Tensor granularity: the same parameter object with another shape is refused, naming the shapes.
    state = terse.torch.CompressionState("topk", ratio=0.1, overlap=False)
    p = torch.zeros(10, 10)
    hook_fn(state, FakeBucket(0, [p])).wait()
    p.data = torch.zeros(5, 10)
    expect_error(terse.InvalidArgument, "was bound as f32 [10, 10] and is now f32 [5, 10]",
                 lambda: hook_fn(state, FakeBucket(0, [p])))
    # A failed state stays failed, with the same exception type.
    expect_error(terse.InvalidArgument, "an earlier bucket failed, the hook is stopped",
                 lambda: hook_fn(state, FakeBucket(0, [p])))
    # A layout that leaves a gap in the bucket is refused before any collective.
    q, r = torch.zeros(10), torch.zeros(10)
    bad = FakeBucket(1, [q, r], offsets=[0, 0])
    state = terse.torch.CompressionState("topk", ratio=0.1, overlap=False)
    expect_error(terse.InvalidArgument, "must tile its buffer", lambda: hook_fn(state, bad))
    devices(rank)
    # A re-formed default group of another size: the hook says it needs rebuilding.
    state = terse.torch.CompressionState("topk", ratio=0.1, overlap=False)
    dist.destroy_process_group()
    dist.init_process_group("gloo", init_method="file://%s.%d" % (store2, rank), rank=0, world_size=1)
    expect_error(terse.InvalidArgument, "built for rank %d of a process group of 2, the group is now rank 0 of 1" % rank,
                 lambda: hook_fn(state, FakeBucket(0, [torch.zeros(10, 10)])))


def captured_stderr(fn):
    """What fn() writes to file descriptor 2 (terse's log), as text."""
    with tempfile.TemporaryFile(mode="w+") as f:
        saved = os.dup(2)
        sys.stderr.flush()
        os.dup2(f.fileno(), 2)
        try:
            fn()
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        return f.read()


def rebuild_log(hook_fn):
    """Bucket granularity: DDP re-forms its buckets once, in its second step, so sizes changing there are said once at
    info level (main runs this case with TERSE_LOG_LEVEL=info); a change at a later step is a warning."""
    state = terse.torch.CompressionState("topk", ratio=0.1, granularity="bucket", error_feedback=True, overlap=False)

    def step(sizes):
        for i, n in enumerate(sizes):
            hook_fn(state, FakeBucket(i, [torch.zeros(n)], last=i == len(sizes) - 1)).wait()

    step([100, 100])
    log = captured_stderr(lambda: step([120, 80]))
    infos = [line for line in log.splitlines() if "re-formed its buckets" in line]
    check(len(infos) == 1 and infos[0].startswith("terse [info] terse.torch: DDP re-formed its buckets after its "
                                                  "first step"), "DDP's rebuild should be one info line:\n%s" % log)
    check("[warn]" not in log, "DDP's rebuild should not warn:\n%s" % log)
    log = captured_stderr(lambda: step([100, 80]))
    check("terse [warn] terse.torch: bucket 0 changed from [120] f32 to [100] f32 after 2 steps, not DDP's own "
          "rebuild" in log, "a later change should warn:\n%s" % log)
    check(state.buckets()[0]["numel"] == 100, "bucket 0 should now hold 100 elements: %s" % state.buckets())


def devices(rank):
    """The device binding's refusals that a machine without a GPU can reach (tests/python/ddp_hook_cuda_test.py has
    the CUDA path itself). Each is raised before any collective, on every rank alike."""
    hook_fn = terse.torch.compression_hook
    State = terse.torch.CompressionState
    # The state binds to its first bucket's device; a bucket elsewhere is refused, naming both (meta stands in for a
    # second device).
    state = State("topk", ratio=0.1, overlap=False)
    check(state.device is None, "an unbound state reports device %s" % state.device)
    hook_fn(state, FakeBucket(0, [torch.zeros(10)])).wait()
    check(state.device == torch.device("cpu"), "the state bound to %s" % state.device)
    other = FakeBucket(1, [torch.zeros(10)])
    other.buf = torch.zeros(10, device="meta")
    expect_error(terse.InvalidArgument, "bucket 1 is on meta, and this state aggregates the gradients of cpu",
                 lambda: hook_fn(state, other))
    # A module across devices, and a module on a device that is neither CPU nor CUDA.
    mixed = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4, device="meta"))
    expect_error(terse.InvalidArgument, "the module's parameters are on cpu and meta",
                 lambda: State("none", module=mixed))
    # A state bound to CPU tensors refuses CUDA ones (the aggregator's own check, reached here directly).
    state = State("none", module=mlp(), overlap=False)
    expect_error(terse.InvalidArgument, "reached a state bound to CPU tensors", lambda: state._agg.bind_cuda(0, 1))
    if not torch.cuda.is_available():
        # A compressor without CUDA code is refused naming it, on any machine (test_throws is host-only).
        state = State("test_throws", plugin_path=[ARGS.fixture_plugins], overlap=False)
        expect_error(terse.Unsupported, "compressor 'test_throws'", lambda: state._agg.bind_cuda(0, 1))
        expect_error(terse.Unsupported, "has no CUDA code", lambda: state._agg.bind_cuda(0, 1))
        # A built-in one reaches the next check: this build has no CUDA (its plugins are host-only then), or no device.
        state = State("fp16", overlap=False)
        want = "is not visible to terse" if terse._terse.built_with_cuda else "this terse was built without CUDA"
        expect_error(terse.Unsupported, want, lambda: state._agg.bind_cuda(0, 1))
        check(not state._agg.bound, "a refused binding left the state bound")
        # The stream handle 0 is terse's "host"; torch's default stream arrives as cudaStreamLegacy.
        expect_error(terse.InvalidArgument, "needs a stream", lambda: state._agg.bind_cuda(0, 0))


# ---- overlap


def deep_mlp(seed=1):
    torch.manual_seed(seed)
    layers = [nn.Linear(784, 256), nn.ReLU()]
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(256, 10))


def check_same_as_without_overlap(finals, rank, name):
    """Every overlap mode's parameters in `finals` (mode -> parameters) equal overlap=False's, bit for bit."""
    for mode in finals:
        for i, (a, b) in enumerate(zip(finals[mode], finals[False])):
            check(torch.equal(a, b), "rank %d %s: parameter %d differs with overlap=%s by up to %g"
                  % (rank, name, i, mode, (a - b).abs().max()))


def overlap(rank):
    # Several buckets: 64 KB for the first, 0.25 MB for the others, about six over this model's 1.2 MB.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024
    # No involuntary GIL switch inside a hook call: the worker can complete a Future only once the hook has returned
    # and DDP let the GIL go, so `done()` right after the call is False whenever the hook returned before the work.
    sys.setswitchinterval(30.0)
    try:
        for name, params in (("fp16", {}), ("topk", {"ratio": 0.01}), ("powersgd", {"rank": 2})):
            finals = {}
            # PowerSGD also with overlap="chain": True keeps a multi-round compressor on the worker (terse/torch.py,
            # _chains), "chain" chains its rounds.
            for overlapped in (("chain", True, False) if name == "powersgd" else (True, False)):
                model = deep_mlp()
                ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
                state = terse.torch.CompressionState(name, module=model, error_feedback=True, overlap=overlapped,
                                                     **params)
                seen = []  # (bucket index, done when the hook returned, the step's last bucket)

                def probe(state, bucket):
                    if rank == 1 and bucket.index() == 0:
                        # Rank 0's collectives of bucket 0 cannot complete before this rank joins them: a chained
                        # Future (completed by gloo's thread, which may take the GIL while the hook call lets it go)
                        # is then certainly not complete when rank 0's hook returns.
                        time.sleep(0.05)
                    elif rank == 0 and bucket.index() == 2:
                        # Rank 0 hands bucket 2 over late, after bucket 0's first round completed, and rank 1 early:
                        # PowerSGD's later rounds then become ready on each rank at another point among the hook
                        # calls, which must not change the order they are issued in (terse/torch.py, _Sequencer).
                        time.sleep(0.03)
                    fut = terse.torch.compression_hook(state, bucket)
                    done = fut.done()  # first: torch's GradBucket methods let the GIL go
                    seen.append((bucket.index(), done, bucket.is_last()))
                    return fut

                ddp.register_comm_hook(state, probe)
                train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), 6, rank)
                buckets = len(state.buckets())
                check(buckets >= 3, "%s: expected several buckets, DDP made %d" % (name, buckets))
                # fp16 (one-round SUM) and PowerSGD (two SUM rounds) are chained on torch's asynchronous collectives;
                # top-k (an all-gather) runs on the worker.
                check(state._chain == (overlapped == "chain" or (overlapped is True and name == "fp16")),
                      "%s overlap=%s: chained %s" % (name, overlapped, state._chain))
                # DDP's first step has one bucket, index 0 and the step's last; the later steps several.
                firsts = [done for index, done, last in seen if index == 0 and not last]
                check(firsts, "%s: bucket 0 was never followed by another bucket" % name)
                if overlapped:
                    if rank == 0 or not state._chain:
                        check(not any(firsts), "%s: bucket 0's Future was complete when the hook returned (%d of %d "
                              "steps)" % (name, sum(firsts), len(firsts)))
                    if not state._chain:
                        # The worker completes a Future only after the hook returned (the GIL is held throughout).
                        check(not any(done for _, done, _ in seen), "%s: a Future completed inside the hook" % name)
                    elif name == "fp16":
                        # A one-round compressor's last bucket is waited for in its hook call (terse/torch.py,
                        # _OneRound._last): nothing of backward is left to overlap it with.
                        check(all(done for _, done, last in seen if last), "%s: the last bucket's Future was not "
                              "complete when its hook call returned" % name)
                else:
                    check(all(done for _, done, _ in seen), "%s: without overlap every Future is complete" % name)
                # Counted in both modes (how much of it backward waits is a benchmark's question, not a test's).
                times = state.times()
                check(times["exposed_s"] > 0 and math.isfinite(times["exposed_s"]),
                      "%s overlap=%s: exposed %s" % (name, overlapped, times["exposed_s"]))
                finals[overlapped] = [p.detach().clone() for p in model.parameters()]
                state.close()
            check_same_as_without_overlap(finals, rank, name)
        # A bucket that fails on the worker: DDP's error names terse's exception, and no bucket behind it reaches a
        # collective (both ranks fail alike here, so none would wait either way).
        model = deep_mlp()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
        # Failing at step 1 on every rank: DDP holds one bucket in its first step and its own ones from the second.
        state = terse.torch.CompressionState("fail_at_step", fail_step=1, fail_rank=-1,
                                             plugin_path=ARGS.runner_plugins, module=model, overlap="thread")
        futures = keeping_futures(ddp, state)
        train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05), 1, rank)
        del futures[:]
        x, y = batch(1, rank)
        expect_terse_error(terse.PluginError, "fail_at_step", lambda: F.cross_entropy(ddp(x), y).backward())
        state.close()
        errors = []
        for fut in futures:
            try:
                fut.wait()
            except RuntimeError as e:
                errors.append(str(e))
        # Buckets queued before the worker failed fail through their Futures; a hook call after it raises at once
        # (then backward stops there): which of the two the later buckets meet depends on timing, not on the rule.
        check(len(errors) == len(futures) >= 1, "%d of %d futures failed" % (len(errors), len(futures)))
        check(all("an earlier bucket failed" in e for e in errors[1:]), "later buckets: %s" % errors[1:])
        # Step 0 ran DDP's one bucket; in step 1 no bucket behind the failed one reached the aggregator.
        check(sorted(state.buckets()) == [0], "buckets that ran: %s" % sorted(state.buckets()))
        # Chained (the same one-round SUM plugin, overlap=True): the encode runs in the hook call, so the failing
        # bucket's call raises terse's exception itself, before its collective, and every later call raises too.
        model = deep_mlp()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
        state = terse.torch.CompressionState("fail_at_step", fail_step=1, fail_rank=-1,
                                             plugin_path=ARGS.runner_plugins, module=model)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05), 1, rank)
        check(state._chain, "fail_at_step with overlap=True was not chained")
        x, y = batch(1, rank)
        expect_terse_error(terse.PluginError, "fail_at_step", lambda: F.cross_entropy(ddp(x), y).backward())
        check(isinstance(state.error, terse.PluginError), "chained state's error: %r" % (state.error,))
        check(sorted(state.buckets()) == [0], "chained: buckets that ran: %s" % sorted(state.buckets()))
    finally:
        sys.setswitchinterval(0.005)


def disagree(rank):
    # Ranks whose states differ would pair mismatched collectives (gloo aborts the process, NCCL hangs or sums wrongly):
    # at the first bucket, before any collective of terse's own, every rank raises InvalidArgument naming the settings
    # that differ and each rank's value (terse/torch.py, _check_agreement). Then states built alike train as ever.
    for name, params, other in (("topk", {"ratio": 0.01}, {"ratio": 0.02}), ("topk", {"ratio": 0.01}, None),
                                ("powersgd", {"rank": 2}, {"rank": 4})):
        model = mlp()
        ddp = nn.parallel.DistributedDataParallel(model)
        if rank == 1 and other is None:
            state = terse.torch.CompressionState("fp16", module=model)
        else:
            state = terse.torch.CompressionState(name, module=model, **(other if rank == 1 else params))
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        x, y = batch(0, rank)
        message = expect_terse_error(terse.InvalidArgument, "the ranks' hook states differ in",
                                     lambda: F.cross_entropy(ddp(x), y).backward())
        key = "compressor" if other is None else "params"
        check(key in message and "rank 0:" in message and "rank 1:" in message, "%s: %s" % (name, message))
        check(sorted(state.buckets()) == [], "a bucket was aggregated after the refusal: %s" % state.buckets())
        state.close()
    # A peer whose settings do not read as terse's (another version, a broken rank): the mismatch is still raised on
    # every rank, that rank's values shown as unreadable.
    saved = terse.torch.json
    if rank == 1:
        terse.torch.json = types.SimpleNamespace(dumps=lambda *a, **k: "{not json", loads=json.loads)
    try:
        model = mlp()
        ddp = nn.parallel.DistributedDataParallel(model)
        state = terse.torch.CompressionState("topk", module=model, ratio=0.01)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        x, y = batch(0, rank)
        message = expect_terse_error(terse.InvalidArgument, "the ranks' hook states differ in",
                                     lambda: F.cross_entropy(ddp(x), y).backward())
        check("(unreadable)" in message and "rank 0: compressor='topk" in message,
              "a peer's unreadable settings: %s" % message)
        state.close()
    finally:
        terse.torch.json = saved
    # States built alike train as ever; -0.0 and 0.0 are one setting, though JSON writes them apart.
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = terse.torch.CompressionState("topk", module=model, ratio=0.01, momentum_correction=-0.0 if rank else 0.0)
    ddp.register_comm_hook(state, terse.torch.compression_hook)
    train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05), 2, rank)
    check(state._agreed and state.error is None, "states built alike: %r" % (state.error,))
    state.close()


class WithUnused(nn.Module):
    """deep_mlp and a layer its forward never uses: DDP must be told to find unused parameters."""

    def __init__(self):
        super().__init__()
        self.used = deep_mlp()
        self.unused = nn.Linear(256, 256)

    def forward(self, x):
        return self.used(x)


def group_timeout(group):
    """The timeout torch gave `group`, read where torch keeps it for gloo: in the group's options in torch 1.13 (the
    group is its backend), in its CPU backend's in torch 2.x."""
    backend = group._get_backend(torch.device("cpu")) if hasattr(group, "_get_backend") else group
    return backend.options._timeout


def unused_parameters(rank):
    # DDP with find_unused_parameters=True all-reduces its map of used parameters on its process group as soon as the
    # step's last hook call returns, while an overlapped state may still issue collectives (the worker; PowerSGD's
    # chained rounds). So a state beside such a DDP issues its collectives on a group of its own (terse/torch.py,
    # _group_of_its_own), one for all the states of that DDP group: several buckets, every overlap mode, the
    # parameters equal to overlap=False's bit for bit. The group has the world's timeout (spawn's 60 s), not
    # new_group's default (30 minutes), which would turn a hang the script set a short timeout to catch into a long one.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024
    world_timeout = timedelta(seconds=60)
    check(group_timeout(dist.group.WORLD) == world_timeout,
          "the world group's timeout reads %s, not spawn's %s" % (group_timeout(dist.group.WORLD), world_timeout))
    groups = set()
    for name, params in (("topk", {"ratio": 0.01}), ("powersgd", {"rank": 2})):
        finals = {}
        for overlapped in (True, "chain", "thread", False):
            model = WithUnused()
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25, find_unused_parameters=True)
            state = terse.torch.CompressionState(name, module=ddp, error_feedback=True, overlap=overlapped, **params)
            own = state.process_group is not None and state.process_group is not ddp.process_group
            check(own, "%s overlap=%s: not a group of its own" % (name, overlapped))
            groups.add(id(state.process_group))
            check(group_timeout(state.process_group) == world_timeout, "%s overlap=%s: the state's group has timeout "
                  "%s, not the world's %s" % (name, overlapped, group_timeout(state.process_group), world_timeout))
            ddp.register_comm_hook(state, terse.torch.compression_hook)
            train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), 5, rank)
            check(len(state.buckets()) >= 3, "%s: expected several buckets, DDP made %d" % (name, len(state.buckets())))
            finals[overlapped] = [p.detach().clone() for p in model.parameters()]
            state.close()
        check_same_as_without_overlap(finals, rank, name)
    # One group, made once and reused by every later state beside the same DDP group (never one a state).
    check(len(groups) == 1, "%d groups of terse's own for one DDP group" % len(groups))
    # A later state that asks for another timeout is refused: the group is made once, and a rank that made a second
    # one would wait in new_group for ranks that reuse the first.
    model = WithUnused()
    ddp = nn.parallel.DistributedDataParallel(model, find_unused_parameters=True)
    short = timedelta(seconds=45)
    expect_terse_error(terse.InvalidArgument, "already made that group beside DDP's with timeout 0:01:00",
                       lambda: terse.torch.CompressionState("fp16", module=ddp, timeout=short))
    # timeout= gives the group another timeout when the process makes it (here after forgetting the one made above, on
    # every rank alike): made once, shared by the states that give the same timeout.
    terse.torch._OWN_GROUPS.clear()
    states = [terse.torch.CompressionState("fp16", module=ddp, timeout=short) for _ in range(2)]
    check(states[0].process_group is states[1].process_group and id(states[0].process_group) not in groups,
          "timeout= did not make one group of its own, apart from the world timeout's")
    check(group_timeout(states[0].process_group) == short,
          "timeout=%s: the state's group has timeout %s" % (short, group_timeout(states[0].process_group)))
    for state in states:
        state.close()
    for bad in (45, timedelta(0), timedelta(seconds=-1), "45s"):
        expect_terse_error(terse.InvalidArgument, "'timeout' must be a datetime.timedelta longer than zero",
                           lambda: terse.torch.CompressionState("fp16", module=ddp, timeout=bad))
    expect_terse_error(terse.InvalidArgument, "this state makes none (module= is not such a DDP wrapper)",
                       lambda: terse.torch.CompressionState("fp16", module=model, timeout=short))
    # Where torch does not show the DDP group's timeout (a backend other than gloo and NCCL), the state asks for
    # timeout= rather than give its group torch's default.
    reader = terse.torch._timeout_of
    terse.torch._timeout_of = lambda group: None
    try:
        expect_terse_error(terse.InvalidArgument, "does not show that group's timeout (backend 'gloo'): pass timeout=",
                           lambda: terse.torch.CompressionState("fp16", module=ddp))
    finally:
        terse.torch._timeout_of = reader
    # A DDP group other than the default one cannot be copied by every rank: refused, naming what to pass; a group
    # of terse's own is used as given.
    sub = dist.new_group(ranks=list(range(WORLD)))
    model = WithUnused()
    ddp = nn.parallel.DistributedDataParallel(model, process_group=sub, find_unused_parameters=True)
    expect_terse_error(terse.InvalidArgument, "find_unused_parameters=True",
                       lambda: terse.torch.CompressionState("fp16", module=ddp, process_group=sub))
    mine = dist.new_group(ranks=list(range(WORLD)))
    state = terse.torch.CompressionState("fp16", module=ddp, process_group=mine)
    check(state.process_group is mine, "a group of terse's own was not used as given")
    state.close()


def in_place(rank):
    # none declares TERSE_CAP_IDENTITY, so the hook sums its buckets where they lie and never calls the plugin
    # (ddp_aggregator.h). The fixture bad_caps shows that the plugin is skipped: mode identity_lies declares the flag
    # and flips the lowest bit of every value it encodes. In place its runs equal mode ok's (an honest identity without
    # the flag, through the plugin path) bit for bit; through the plugin path (error feedback on, whose residual needs
    # the codec) they cannot. Three ranks, so the average divides by 3 and rounds, as the plugin path's does.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024
    bad_caps = os.path.join(ARGS.fixture_dir, "terse_compressor_bad_caps.so")

    def run(compressor, overlap, **params):
        model = deep_mlp()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
        state = terse.torch.CompressionState(compressor, module=model, overlap=overlap, **params)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), 4, rank)
        buckets = state.buckets()
        in_place = state._agg.in_place
        state.close()
        return [p.detach().clone() for p in model.parameters()], buckets, in_place

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a, b))

    honest, _, through_plugin = run(bad_caps, False, mode="ok")
    check(not through_plugin, "bad_caps mode=ok does not declare TERSE_CAP_IDENTITY, yet the hook sums it in place")
    for overlap in (True, False, "thread"):
        for name, params in (("identity_lies", {"compressor": bad_caps, "mode": "identity_lies"}),
                             ("none", {"compressor": "none"})):
            params = dict(params)
            finals, buckets, in_place = run(params.pop("compressor"), overlap, **params)
            check(in_place, "%s overlap=%s: not summed in place" % (name, overlap))
            check(same(finals, honest), "rank %d, %s overlap=%s: the in-place sum differs from the plugin path's"
                  % (rank, name, overlap))
            check(len(buckets) >= 3, "%s: expected several buckets, DDP made %d" % (name, len(buckets)))
            for index, b in buckets.items():
                # The body's bytes only: no header is produced, and the bucket is one tensor.
                check(b["last_step"]["payload"] == 4 * b["numel"] and b["tensors"] == 1,
                      "%s overlap=%s, bucket %d: %r" % (name, overlap, index, b))
    # Odd sizes and an empty bucket, chained and not: bucket 0 holds 7 + 0 elements, bucket 1 none at all (DDP never
    # hands over an empty bucket, but an empty one must issue nothing on every rank and still complete).
    for overlap in (True, False):
        state = terse.torch.CompressionState("none", overlap=overlap)
        fut0 = terse.torch.compression_hook(state, FakeBucket(0, [torch.zeros(7), torch.zeros(0)], last=False,
                                                              fill=rank + 1))
        fut1 = terse.torch.compression_hook(state, FakeBucket(1, [torch.zeros(0)], last=True))
        check(fut0.wait().tolist() == [2.0] * 7, "overlap=%s: bucket 0 averaged to %s" % (overlap, fut0.value()))
        check(fut1.wait().numel() == 0, "overlap=%s: the empty bucket gave %s" % (overlap, fut1.value()))
        buckets = state.buckets()
        check(buckets[0]["last_step"]["payload"] == 28 and buckets[1]["last_step"]["payload"] == 0,
              "overlap=%s: %r" % (overlap, buckets))
        check(state._agg.in_place, "overlap=%s: not in place" % overlap)
        state.close()
    # Only f32 is summed in place: a bucket of another dtype goes to the plugin, which refuses it by name (the hook
    # once left its members out as for an in-place bucket, and the refusal spoke of tensors holding 0 elements).
    state = terse.torch.CompressionState("none", overlap=False)
    doubles = FakeBucket(0, [torch.zeros(3, dtype=torch.float64), torch.zeros(4, dtype=torch.float64)])
    doubles.buf = doubles.buf.double()
    expect_error(terse.Unsupported, "only f32 gradients are supported, got f64",
                 lambda: terse.torch.compression_hook(state, doubles).wait())
    state.close()
    # The plugin path, where the flag cannot be used: its flipped bits show.
    lied, _, in_place = run(bad_caps, True, mode="identity_lies", error_feedback=True)
    check(not in_place, "with error feedback the hook must call the codec")
    check(not same(lied, honest), "identity_lies through the plugin path equals the honest run: was it called?")


def chained_one_round(rank):
    # A one-round SUM compressor is chained without the sequencer (terse/torch.py, _OneRound), and must place failures
    # as the sequencer does. Three ranks, several buckets; rank 1 waits 50 ms before each hook call, so it has noticed
    # bucket 0's failed decode (on gloo's thread) before its next call, while ranks 0 and 2 have issued theirs.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024
    for fail_in, kind, says in (("decompress", terse.PluginError, "decompress failing on purpose at step 2"),
                                ("compress", terse.PluginError, "failing on purpose at step 2")):
        model = deep_mlp()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
        state = terse.torch.CompressionState("fail_at_step", fail_step=2, fail_rank=-1, fail_in=fail_in, module=model,
                                             plugin_path=[ARGS.runner_plugins], overlap=True)
        futures = []

        def delayed(state, bucket):
            time.sleep(0.05 if rank == 1 else 0.0)
            futures.append(terse.torch.compression_hook(state, bucket))
            return futures[-1]

        ddp.register_comm_hook(state, delayed)
        train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05), 2, rank)
        check(isinstance(state._sequencer, terse.torch._OneRound) and state.error is None,
              "%s: chained %r, error %r" % (fail_in, state._sequencer, state.error))
        check(len(state.buckets()) >= 3, "expected several buckets, DDP made %d" % len(state.buckets()))
        del futures[:]
        x, y = batch(2, rank)
        # A decode fails on every bucket of the step, each noticed at its own moment: the step's hook calls still issue
        # on every rank (were one rank to stop at the first failure it noticed, the others would wait inside its
        # collective until the 20 s timeout). An encode fails in the hook call itself, alike on every rank.
        expect_terse_error(kind, says, lambda: F.cross_entropy(ddp(x), y).backward())
        deadline = time.monotonic() + 10
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            time.sleep(0.01)
        # The compress fails in the step's first hook call, which returns no Future.
        check((futures or fail_in == "compress") and all(f.done() for f in futures),
              "%s: %d of %d Futures complete 10 s after the failure" % (fail_in, sum(f.done() for f in futures),
                                                                       len(futures)))
        check(isinstance(state.error, kind), "%s: state's error %r" % (fail_in, state.error))
        # The next step's first hook call raises at once, before any collective.
        expect_error(kind, "an earlier bucket failed, the hook is stopped",
                     lambda: terse.torch.compression_hook(state, FakeBucket(0, [next(model.parameters())])))
        state.close()


def chained_order(rank):
    # Three ranks, each handing DDP's buckets over after delays of its own (seeded by rank): the later rounds of two
    # two-round SUM compressors become ready at other points among the hook calls on every rank, and must still be
    # issued in one order (terse/torch.py, _Sequencer): out of order, gloo aborts ("op.preamble.length <= op.nbytes")
    # or the ranks wait until the 20 s timeout. The parameters equal the unchained run's (overlap=False) bit for bit.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024
    for name, params in (("test_rounds", {"plugin_path": [ARGS.test_plugins]}),
                         ("powersgd", {"rank": 2, "error_feedback": True})):
        finals = {}
        for overlapped in (True, False):
            model = deep_mlp()
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
            state = terse.torch.CompressionState(name, module=model, overlap="chain" if overlapped else False,
                                                 **params)
            delays = random.Random(100 + rank)

            def delayed(state, bucket):
                time.sleep(delays.choice((0.0, 0.0, 0.002, 0.01)))
                return terse.torch.compression_hook(state, bucket)

            ddp.register_comm_hook(state, delayed)
            train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), 5, rank)
            check(state._chain == overlapped, "%s overlap=%s: chained %s" % (name, overlapped, state._chain))
            check(len(state.buckets()) >= 3, "%s: expected several buckets, DDP made %d" % (name, len(state.buckets())))
            finals[overlapped] = [p.detach().clone() for p in model.parameters()]
            state.close()
        for i, (a, b) in enumerate(zip(finals[True], finals[False])):
            check(torch.equal(a, b), "rank %d %s: parameter %d differs chained by up to %g"
                  % (rank, name, i, (a - b).abs().max()))
    # A failure between two rounds, on a collective's callback thread: round 1's encode fails at step 2 on every rank.
    # Backward raises terse's error naming the plugin's; every Future handed to DDP completes (none is left behind a
    # round that will never be issued); a later hook call raises at once; close() returns.
    model = deep_mlp()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    state = terse.torch.CompressionState("test_rounds", fail_step=2, plugin_path=[ARGS.test_plugins], module=model,
                                         overlap="chain")
    futures = keeping_futures(ddp, state)
    train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05), 2, rank)
    check(state._chain and state.error is None, "test_rounds: chained %s, error %r" % (state._chain, state.error))
    del futures[:]
    x, y = batch(2, rank)
    # The plugin refuses with TERSE_ERR_INVALID_ARGUMENT: terse's InvalidArgument, naming the plugin.
    text = expect_terse_error(terse.InvalidArgument, "fails from step 2", lambda: F.cross_entropy(ddp(x), y).backward())
    check("compressor 'test_rounds'" in text, "the error does not name the plugin: %s" % text)
    check(isinstance(state.error, terse.InvalidArgument), "state's error: %r" % (state.error,))
    check_all_done(futures, "the failed step")
    state.times()  # waits for the buckets in flight: none is left
    # The state stays failed: the next hook call raises at once, before any collective. (DDP itself refuses another
    # backward after a failed one: its reduction did not finish.)
    expect_error(terse.InvalidArgument, "an earlier bucket failed, the hook is stopped",
                 lambda: terse.torch.compression_hook(state, FakeBucket(0, [next(model.parameters())])))
    state.close()
    # A failure while a ready round waits behind a bucket that will never come: buckets 0 and 1 are handed over, and
    # bucket 1's second round (after bucket 2's first in the order) is ready; then bucket 2's hook call is refused
    # (a layout that does not tile its buffer), so backward would stop there. Bucket 1 must not wait for bucket 2:
    # its Future fails, at once.
    state = terse.torch.CompressionState("test_rounds", plugin_path=[ARGS.test_plugins], overlap="chain")
    p0, p1, p2, p3, empty = (torch.zeros(n) for n in (5, 7, 3, 3, 0))
    # Bucket 0 holds an empty tensor beside p0 (odd sizes, an empty member: both rounds must still pair).
    fut0 = terse.torch.compression_hook(state, FakeBucket(0, [empty, p0], last=False, fill=rank + 1))
    fut1 = terse.torch.compression_hook(state, FakeBucket(1, [p1], last=False, fill=rank + 1))
    check(state._chain, "test_rounds was not chained")
    deadline = time.monotonic() + 10
    while (1, 1) not in state._sequencer._ready and time.monotonic() < deadline:
        time.sleep(0.001)
    check((1, 1) in state._sequencer._ready, "bucket 1's second round never became ready")
    # test_rounds is lossless on integers: 1 + 2 + 3 over three ranks, averaged.
    check(fut0.wait().tolist() == [2.0] * 5, "bucket 0 averaged to %s" % fut0.value())
    expect_error(terse.InvalidArgument, "must tile its buffer",
                 lambda: terse.torch.compression_hook(state, FakeBucket(2, [p2, p3], offsets=[0, 0], last=False)))
    deadline = time.monotonic() + 10
    while not fut1.done() and time.monotonic() < deadline:
        time.sleep(0.001)
    check(fut1.done(), "bucket 1's Future waits for a bucket that will never be handed over")
    expect_terse_error(terse.InvalidArgument, "an earlier bucket failed", fut1.wait)
    state.times()


# ---- api


def settle_later(rank):
    # On CUDA the chained buckets leave their payload checks' verdicts on the device and the finish that ends the step
    # reads them all (ddp_aggregator.h: a step's buckets counted by epoch; under gloo they finish in any order). The
    # host can run the same bookkeeping (settle_later): three ranks handing buckets over after delays of their own, so
    # gloo's threads finish them in other orders on every rank, fp16
    # chained alone (_OneRound) and PowerSGD + EF round by round (_Sequencer). Every step's verdicts are read exactly
    # once (verdict_reads), the parameters equal the unchained run's bit for bit, and a decode that fails at step 2
    # fails backward with terse's error, completes every Future and stops the hook.
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024
    steps = 5
    for name, params in (("fp16", {}), ("powersgd", {"rank": 2, "error_feedback": True})):
        finals = {}
        for overlapped in (True, False):
            model = deep_mlp()
            ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
            state = terse.torch.CompressionState(name, module=model, overlap="chain" if overlapped else False,
                                                 **params)
            state._agg.settle_later = True
            delays = random.Random(200 + rank)

            def delayed(state, bucket):
                time.sleep(delays.choice((0.0, 0.0, 0.002, 0.01)))
                return terse.torch.compression_hook(state, bucket)

            ddp.register_comm_hook(state, delayed)
            train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), steps, rank)
            check(state._chain == overlapped and state.error is None,
                  "%s overlap=%s: chained %s, error %r" % (name, overlapped, state._chain, state.error))
            check(len(state.buckets()) >= 3, "%s: expected several buckets, DDP made %d" % (name, len(state.buckets())))
            reads = state._agg.verdict_reads
            check(reads == (steps if overlapped else 0), "%s overlap=%s: the verdicts were read %d times in %d steps"
                  % (name, overlapped, reads, steps))
            finals[overlapped] = [p.detach().clone() for p in model.parameters()]
            state.close()
        for i, (a, b) in enumerate(zip(finals[True], finals[False])):
            check(torch.equal(a, b), "rank %d %s: parameter %d differs with the verdicts read once a step by up to %g"
                  % (rank, name, i, (a - b).abs().max()))
    model = deep_mlp()
    ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
    state = terse.torch.CompressionState("fail_at_step", fail_step=2, fail_rank=-1, fail_in="decompress", module=model,
                                         plugin_path=[ARGS.runner_plugins], overlap=True)
    state._agg.settle_later = True
    futures = keeping_futures(ddp, state)
    train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.05), 2, rank)
    # (fail_at_step is a C plugin without the deferred entry point: its buckets leave no words, and so no reads; what
    # runs is the steps' counting around a finish that throws.)
    check(state._chain and state.error is None, "fail_at_step: chained %s, error %r" % (state._chain, state.error))
    del futures[:]
    x, y = batch(2, rank)
    expect_terse_error(terse.PluginError, "decompress failing on purpose at step 2",
                       lambda: F.cross_entropy(ddp(x), y).backward())
    check_all_done(futures, "the failed step")
    expect_error(terse.PluginError, "an earlier bucket failed, the hook is stopped",
                 lambda: terse.torch.compression_hook(state, FakeBucket(0, [next(model.parameters())])))
    state.close()


def settle_order(rank):
    # The same bookkeeping driven by hand, in orders a test can name: one rank (a sum over one rank is the payload
    # itself, so no collective is issued), the aggregator's chained calls made directly.
    def begin(agg, index, t, last):
        return agg.begin_chained(index, t.data_ptr(), t.numel(), str(t.dtype), [(index, 0, tuple(t.shape))], last)

    def finish_all(agg, pending):
        while agg.finish_chained(pending, 0.0) is not None:
            pass

    # Values fp16 and test_rounds carry exactly: every decode must give them back.
    inputs = [torch.arange(n, dtype=torch.float32) * 0.5 - 2.0 for n in (5, 300, 7)]
    state = terse.torch.CompressionState("fp16", overlap="chain")
    agg = state._agg
    agg.bind_host()
    agg.settle_later = True
    for step, order in enumerate(((2, 0, 1), (1, 2, 0), (0, 1, 2))):
        bufs = [x.clone() for x in inputs]
        pending = [begin(agg, i, bufs[i], i == 2)[0] for i in range(3)]
        for k, i in enumerate(order):
            check(agg.verdict_reads == step, "fp16 step %d: the checks were read before bucket %d of %s finished"
                  % (step, i, order))
            finish_all(agg, pending[i])
        check(agg.verdict_reads == step + 1, "fp16 step %d, order %s: read %d times" % (step, order, agg.verdict_reads))
        check(all(torch.equal(b, x) for b, x in zip(bufs, inputs)), "fp16 step %d: a bucket decoded wrong" % step)
    # A caller that begins a bucket again whose step never ended (no last bucket): its unread checks are read first.
    buf = inputs[0].clone()
    finish_all(agg, begin(agg, 0, buf, False)[0])
    check(agg.verdict_reads == 3, "a step without its last bucket read its checks (%d)" % agg.verdict_reads)
    finish_all(agg, begin(agg, 0, buf, False)[0])
    check(agg.verdict_reads == 4, "bucket 0 began again with its checks unread (%d reads)" % agg.verdict_reads)
    state.close()

    # Two rounds (test_rounds): a finish that lays out the next round is not the bucket's end.
    state = terse.torch.CompressionState("test_rounds", plugin_path=[ARGS.test_plugins], overlap="chain", fail_step=2)
    agg = state._agg
    agg.bind_host()
    agg.settle_later = True
    for step in range(2):
        bufs = [x.clone() for x in inputs[:2]]
        p0, p1 = begin(agg, 0, bufs[0], False)[0], begin(agg, 1, bufs[1], True)[0]
        check(agg.finish_chained(p1, 0.0) is not None, "test_rounds: round 0's finish laid out no round 1")
        finish_all(agg, p1)
        check(agg.verdict_reads == step, "test_rounds step %d: read before bucket 0 ended" % step)
        finish_all(agg, p0)
        check(agg.verdict_reads == step + 1, "test_rounds step %d: read %d times" % (step, agg.verdict_reads))
        check(all(torch.equal(b, x) for b, x in zip(bufs, inputs)), "test_rounds step %d: decoded wrong" % step)
    # Step 2: round 1's encode fails in every bucket's first finish. The step's checks are given up with it, and a
    # caller that goes on finds its next step read as ever.
    bufs = [x.clone() for x in inputs[:2]]
    p0, p1 = begin(agg, 0, bufs[0], False)[0], begin(agg, 1, bufs[1], True)[0]
    for p in (p1, p0):
        expect_error(terse.InvalidArgument, "round 1 fails from step 2", lambda: agg.finish_chained(p, 0.0))
    check(agg.verdict_reads == 2, "test_rounds: a failed step read its checks (%d)" % agg.verdict_reads)
    state.close()


def api(rank):
    State = terse.torch.CompressionState
    state = State("randomk", ratio=0.01, unbiased=True, overlap=False)
    check(state.params == {"ratio": "0.01", "unbiased": "true"}, "typed values became %s" % state.params)
    state = State("qsgd", params={"levels": 16})
    check(state.params == {"levels": "16"}, "params= became %s" % state.params)
    expect_error(terse.InvalidArgument, "compressor parameter 'ratio' must be a bool, int, float or str, got list",
                 lambda: State("topk", ratio=[0.01]))
    expect_error(terse.InvalidArgument, "compressor parameter 'ratio' must be finite, got nan",
                 lambda: State("topk", ratio=float("nan")))
    expect_error(terse.InvalidArgument, "compressor parameter 'ratio' is given twice",
                 lambda: State("topk", ratio=0.1, params={"ratio": 0.2}))
    expect_error(terse.InvalidArgument, "'error_feedback' must be True or False, got 'yes'",
                 lambda: State("topk", error_feedback="yes"))
    expect_error(terse.InvalidArgument, "'overlap' must be True, False, 'thread' or 'chain', got 1",
                 lambda: State("none", overlap=1))
    expect_error(terse.InvalidArgument, "'overlap' must be True, False, 'thread' or 'chain', got 'threads'",
                 lambda: State("none", overlap="threads"))
    expect_error(terse.InvalidArgument, "stream must be 'current' or 'side' (or None), got 'own'",
                 lambda: State("none", stream="own"))
    for bad in (-1, 2.0, True, 10 ** 9 + 1):
        expect_error(terse.InvalidArgument, "'compression_start_step' must be an integer in [0, 1e9]",
                     lambda: State("powersgd", compression_start_step=bad))
    expect_error(terse.InvalidArgument, "compression_start_step=5 with momentum_correction=0.9: DGC's momentum",
                 lambda: State("topk", ratio=0.01, momentum_correction=0.9, compression_start_step=5))
    check(State("powersgd", compression_start_step=5)._settings["compression_start_step"] == 5,
          "compression_start_step was not kept among the settings the ranks compare")
    check(State("none", stream="side").stream == "side", "stream='side' was not kept")
    # The wire dtype as `terse plugins show` and provenance.json give it: only a SUM payload has one.
    check(State("topk", ratio=0.01).caps["wire_dtype"] == "-", "topk (allgather) reports a wire dtype")
    check(State("fp16").caps["wire_dtype"] == "f16", "fp16's wire dtype is not f16")
    expect_error(terse.InvalidArgument, "'seed' must be an integer in [0, 2^64), got -1",
                 lambda: State("none", seed=-1))
    expect_error(terse.InvalidArgument, "'momentum_correction' must be a number in [0, 1), got '0.9'",
                 lambda: State("none", momentum_correction="0.9"))
    expect_error(terse.InvalidArgument, "compressor must be a plugin name or path, got None", lambda: State(None))
    # EF21's keywords: typed, with error feedback on, its momentum with it only, not beside DGC or a CUSTOM compressor.
    check(State("topk", ratio=0.1, error_feedback=True, error_feedback_rule="ef21", ef21_momentum=0.1)
          ._settings["error_feedback_rule"] == "ef21", "error_feedback_rule='ef21' was not kept")
    expect_error(terse.InvalidArgument, "'error_feedback_rule' must be 'ef' or 'ef21', got 'EF21'",
                 lambda: State("topk", error_feedback=True, error_feedback_rule="EF21"))
    expect_error(terse.InvalidArgument, "error_feedback_rule='ef21' with error_feedback=False",
                 lambda: State("topk", error_feedback_rule="ef21"))
    for eta in (0, 1.5, True, "0.1"):
        expect_error(terse.InvalidArgument, "'ef21_momentum' must be a number in (0, 1]",
                     lambda: State("topk", error_feedback=True, error_feedback_rule="ef21", ef21_momentum=eta))
    expect_error(terse.InvalidArgument, "ef21_momentum=0.5 with error_feedback_rule='ef': the momentum is EF21-SGDM's",
                 lambda: State("topk", error_feedback=True, ef21_momentum=0.5))
    expect_error(terse.InvalidArgument, "codec option 'ef21_momentum' 1e-300 rounds to 0 as a float",
                 lambda: State("topk", error_feedback=True, error_feedback_rule="ef21", ef21_momentum=1e-300))
    expect_error(terse.InvalidArgument, "codec option 'momentum_correction' (0.9) cannot be combined with EF21",
                 lambda: State("topk", error_feedback=True, error_feedback_rule="ef21", momentum_correction=0.9))
    expect_error(terse.Unsupported, "compressor 'signsgd' has CUSTOM aggregation",
                 lambda: State("signsgd", error_feedback=True, error_feedback_rule="ef21"))
    expect_error(terse.Unsupported, "compressor 'fp16' sums in f16: use one that sums in f32",
                 lambda: State("fp16", error_feedback=True, error_feedback_rule="ef21"))
    # The plugin's own validation, on the typed value's text.
    expect_error(terse.InvalidArgument, "topk: unknown parameter 'ration'", lambda: State("topk", ration=0.1))
    # Whether a multi-round compressor may chain on CUDA gradients: its later rounds' checks of prev stay on the device
    # (PowerSGD exports compress_deferred), unless deferral is turned off (TERSE_DEFER_VERDICTS=0, the -sync rows).
    saved = os.environ.pop("TERSE_DEFER_VERDICTS", None)
    try:
        check(State("powersgd", rank=2)._agg.prev_checks_deferred is True, "PowerSGD's checks of prev do not defer")
        os.environ["TERSE_DEFER_VERDICTS"] = "0"
        check(State("powersgd", rank=2)._agg.prev_checks_deferred is False, "deferral off, PowerSGD's still defer")
    finally:
        os.environ.pop("TERSE_DEFER_VERDICTS", None)
        if saved is not None:
            os.environ["TERSE_DEFER_VERDICTS"] = saved
    # A misspelt keyword of the state's own reaches the plugin too: its refusal says which keyword it is close to.
    expect_error(terse.InvalidArgument, "nor is 'error_feedbak' a keyword of CompressionState: did you mean "
                 "error_feedback=?", lambda: State("topk", ratio=0.1, error_feedbak=True))
    # Python's exceptions carry no C++ source location (the CLI prints none either).
    try:
        State("topk", ration=0.1)
    except terse.InvalidArgument as e:
        check("[core/" not in str(e) and ".cc:" not in str(e), "a source location in %r" % str(e))
    # A module off the CPU is refused here, naming its device and the compressor, before anything is registered
    # (the meta device stands in for CUDA on a machine without one).
    meta = nn.Linear(4, 4, device="meta")
    expect_error(terse.Unsupported, "the module's parameters are on meta", lambda: State("fp16", module=meta))
    # module= that is not a module is refused by name, as every other keyword is (not an AttributeError).
    for bad in (torch.zeros(3), [nn.Linear(4, 4)], "model"):
        expect_error(terse.InvalidArgument, "'module' must be a torch.nn.Module (the model or its DDP wrapper), got "
                     + type(bad).__name__, lambda: State("none", module=bad))
        expect_error(terse.InvalidArgument, "ResultsLogger: 'module' must be a torch.nn.Module",
                     lambda: terse.torch.ResultsLogger("unused", module=bad))
    expect_error(terse.InvalidArgument, "ResultsLogger: a run without a terse hook needs module= or bytes_per_step=",
                 lambda: terse.torch.ResultsLogger("unused"))
    # A dtype the plugin refuses is refused here when module= shows it, with the plugin's message, not at the first
    # backward; parameters that need no gradient do not count, and a dtype torch cannot average is named.
    doubles = nn.Linear(4, 4).double()
    expect_error(terse.Unsupported, "topk: only f32 gradients are supported, got f64",
                 lambda: State("topk", ratio=0.1, module=doubles))
    # The message names the parameters of that dtype (a model with one f64 layer among f32 ones).
    mixed = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).double())
    expect_error(terse.Unsupported, "(the module's parameters of that dtype: 1.weight, 1.bias; convert them",
                 lambda: State("topk", ratio=0.1, module=mixed))
    frozen = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4).double().requires_grad_(False))
    State("topk", ratio=0.1, module=frozen).close()
    halves = nn.Linear(4, 4).half()
    expect_error(terse.Unsupported, "topk: only f32 gradients are supported, got f16",
                 lambda: State("topk", ratio=0.1, module=halves))
    # DDP's buckets hold a complex parameter's real view: complex64 is f32 there, accepted.
    State("topk", ratio=0.1, module=nn.Linear(4, 4, dtype=torch.complex64)).close()


# ---- logger


def logger(rank, root):
    steps = 4
    # Study and variant become folders: a config's rule holds for them too, and a bad name is refused on every rank
    # before anything is written (".." wrote the run's files into the root, "../x" outside it, "a/b" nested).
    escape = "../%s-escape" % os.path.basename(root)
    state = terse.torch.CompressionState("none")
    for study, variant in (("logged", ".."), (escape, "v"), ("logged", "a/b"), ("a b", "v"), (".", "v"),
                           ("logged", ""), ("logged", "a:b")):
        bad = ("variant", variant) if study == "logged" else ("study", study)
        expect_error(terse.InvalidArgument, "ResultsLogger: %s=%r must be a folder name ([A-Za-z0-9._-], not '.' or "
                     "'..')" % bad, lambda: terse.torch.ResultsLogger(root, study=study, variant=variant, state=state))
        expect_error(terse.InvalidArgument, "ResultsLogger: %s=%r must be a folder name" % bad,
                     lambda: terse.torch.ResultsLogger(root, study=study, variant=variant, bytes_per_step=4))
    if rank == 0:  # the only rank that writes
        check(os.listdir(root) == [], "refused names left files behind: %s" % os.listdir(root))
        check(not os.path.exists(os.path.join(root, escape)), "a study escaped the root")
    dist.barrier()  # before rank 0 writes the runs below

    # Repeats over seeds: <variant>/seed-N/, as `terse run --seeds` writes them (check_logger reads them back as one row
    # of two seeds). A seed other than the state's is refused: it seeds the compressor's randomness.
    for seed in (1, 2):
        model = mlp()
        ddp = nn.parallel.DistributedDataParallel(model)
        state = terse.torch.CompressionState("fp16", module=model, seed=seed)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        expect_error(terse.InvalidArgument, "seed=%d names the repeat, but the state's seed is %d" % (seed + 5, seed),
                     lambda: terse.torch.ResultsLogger(root, study="repeats", variant="fp16", state=state,
                                                       seed=seed + 5))
        log = terse.torch.ResultsLogger(root, study="repeats", variant="fp16", state=state, seed=seed)
        train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.01), 2, rank)
        log.record(test_accuracy=0.5 + 0.1 * seed, epoch=1.0)
        log.finish()
    expect_error(terse.InvalidArgument, "ResultsLogger: seed must be a non-negative int",
                 lambda: terse.torch.ResultsLogger(root, study="repeats", variant="ddp", bytes_per_step=4, seed=-1))

    # A terse hook's run and a plain-DDP baseline in one study.
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = terse.torch.CompressionState("fp16", module=model)
    ddp.register_comm_hook(state, terse.torch.compression_hook)
    log = terse.torch.ResultsLogger(root, study="logged", variant="terse-fp16", state=state)
    train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.01), steps, rank)
    log.record(test_accuracy=0.5, test_loss=1.0, epoch=1.0)
    log.finish()
    if rank == 0:  # fp16 sends the same bytes from every rank: one rank's count is the mean
        with open(os.path.join(root, "fp16_payload"), "w") as f:
            f.write(str(state.totals()["payload"]))

    base = mlp()
    ddp = nn.parallel.DistributedDataParallel(base)
    log = terse.torch.ResultsLogger(root, study="logged", variant="ddp-allreduce", module=base)
    expect_error(terse.InvalidArgument, "a run without a terse hook must say its step",
                 lambda: log.record(test_accuracy=0.5))
    train_steps(ddp, torch.optim.SGD(base.parameters(), lr=0.01), steps, rank)
    log.record(test_accuracy=0.25, test_loss=2.0, epoch=1.0, step=steps)
    log.finish()
    if rank == 0:
        check(log.results_dir is not None and os.path.isdir(log.results_dir), "no folder: %r" % log.results_dir)
    else:
        check(log.results_dir is None, "rank 1 has a folder: %r" % log.results_dir)
    # A finished logger takes no more records (they would follow a status that says the run ended), names its
    # folder, and writes nothing; a second finish() changes nothing; an error after completion is not dropped.
    folder = os.path.join(root, "logged", "ddp-allreduce")
    expect_error(terse.InvalidArgument, "ResultsLogger.record: the run in %s is finished" % folder,
                 lambda: log.record(test_accuracy=0.5, step=steps + 1))
    log.finish()
    expect_error(terse.InvalidArgument, "ResultsLogger.finish: the run in %s was already marked completed" % folder,
                 lambda: log.finish(error="too late"))

    # Every hook setting that changes the results is in the folder: DGC's masking and Nesterov in the config, the
    # granularity in provenance.json (the schema has no field for it).
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = terse.torch.CompressionState("topk", ratio=0.5, momentum_correction=0.9, momentum_nesterov=True,
                                         momentum_masking=False, granularity="bucket", module=model)
    ddp.register_comm_hook(state, terse.torch.compression_hook)
    log = terse.torch.ResultsLogger(root, study="logged", variant="topk-dgc-bucket", state=state,
                                    description="optimizer { lr: 0.01 momentum: 0 }")
    train_steps(ddp, torch.optim.SGD(model.parameters(), lr=0.01), 2, rank)
    log.record(test_accuracy=0.5, epoch=1.0)
    log.finish()
    state.close()


def check_logger(root):
    repeats = subprocess.run([ARGS.terse, "compare", os.path.join(root, "repeats"), "--format", "csv"], check=True,
                             capture_output=True, text=True).stdout.splitlines()
    header, rows = repeats[0].split(","), [line.split(",") for line in repeats[1:] if line]
    check(len(rows) == 1 and rows[0][header.index("variant")] == "fp16" and rows[0][header.index("seeds")] == "2",
          "the two seeds' folders should read as one variant of two repeats:\n%s" % "\n".join(repeats))
    study = os.path.join(root, "logged")

    def last(variant):
        return json.loads(open(os.path.join(study, variant, "metrics.jsonl")).read().splitlines()[-1])

    numel = sum(p.numel() for p in mlp().parameters())
    dense = 4 * numel
    base, ours = last("ddp-allreduce"), last("terse-fp16")
    check(base["step"] == 4 and ours["step"] == 4, "steps %d / %d" % (base["step"], ours["step"]))
    check(base["payload_bytes_per_worker"] == 4 * dense, "baseline payload %d, expected %d"
          % (base["payload_bytes_per_worker"], 4 * dense))
    check(base["wire_bytes_per_worker"] == 4 * dense, "two ranks: a ring allreduce sends the payload once, got %d"
          % base["wire_bytes_per_worker"])
    hook_payload = int(open(os.path.join(root, "fp16_payload")).read())
    check(ours["payload_bytes_per_worker"] == hook_payload and 4 * dense // 2 < hook_payload < 4 * dense,
          "fp16 payload %d, the hook counted %d (dense %d)" % (ours["payload_bytes_per_worker"], hook_payload, 4 * dense))
    for variant in ("ddp-allreduce", "terse-fp16"):
        status = json.load(open(os.path.join(study, variant, "status.json")))
        check(status.get("state") == "completed", "%s: status %s" % (variant, status))
    config = open(os.path.join(study, "ddp-allreduce", "config.textproto")).read()
    check('name: "none"' in config and "workers: 2" in config, "baseline config:\n%s" % config)
    # The record after finish() left nothing behind.
    status = json.load(open(os.path.join(study, "ddp-allreduce", "status.json")))
    lines = open(os.path.join(study, "ddp-allreduce", "metrics.jsonl")).read().splitlines()
    check(status["records"] == len(lines) == 1, "status %s, %d metrics lines" % (status, len(lines)))
    config = open(os.path.join(study, "topk-dgc-bucket", "config.textproto")).read()
    momentum = re.search(r"momentum_correction \{([^}]*)\}", config)
    check(momentum and re.split(r"\s+", momentum.group(1).strip()) == ["factor:", "0.9", "masking:", "false",
                                                                        "nesterov:", "true"],
          "the config should hold DGC's factor, masking and Nesterov:\n%s" % config)
    hooks = {v: json.load(open(os.path.join(study, v, "provenance.json"))).get("hook")
             for v in ("topk-dgc-bucket", "terse-fp16", "ddp-allreduce")}
    check(hooks == {"topk-dgc-bucket": {"granularity": "bucket"}, "terse-fp16": {"granularity": "tensor"},
                    "ddp-allreduce": None}, "provenance.json's hook settings: %s" % hooks)
    # terse reads the configs back (a config it cannot parse is a warning naming the file) and shows the granularity.
    done = subprocess.run([ARGS.terse, "compare", study, "--format", "csv"], check=True, capture_output=True, text=True)
    check("config.textproto" not in done.stderr, "`terse compare` warned about a config:\n%s" % done.stderr)
    table = done.stdout
    rows = {line.split(",")[1] for line in table.splitlines() if "," in line}
    check({"ddp-allreduce", "terse-fp16", "topk-dgc-bucket"} <= rows,
          "`terse compare` does not list every run:\n%s" % table)
    provenance = subprocess.run([ARGS.terse, "compare", "--provenance", study, "--format", "json"], check=True,
                                capture_output=True, text=True).stdout
    shown = {r["variant"]: r.get("hook") for r in json.loads(provenance)["runs"]}
    check(shown.get("topk-dgc-bucket") == "granularity=bucket" and shown.get("ddp-allreduce") == "",
          "`terse compare --provenance` should show the hook's granularity: %s" % shown)
    print("logger: baseline %d B, fp16 %d B per worker; compare lists both" % (base["payload_bytes_per_worker"],
                                                                               ours["payload_bytes_per_worker"]))


# ---- step trace


def step_trace(rank, root):
    dist._DEFAULT_FIRST_BUCKET_BYTES = 64 * 1024
    expect_error(terse.InvalidArgument, "step_trace=True needs module=",
                 lambda: terse.torch.CompressionState("topk", ratio=0.01, step_trace=True))
    finals = {}
    for traced in (False, True):
        model = deep_mlp()
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.25)
        state = terse.torch.CompressionState("topk", module=ddp, ratio=0.01, error_feedback=True, step_trace=traced)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        log = terse.torch.ResultsLogger(root, study="traced", variant="topk-%s" % traced, state=state)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for s in range(5):
            x, y = batch(s, rank)
            opt.zero_grad()
            F.cross_entropy(ddp(x), y).backward()
            opt.step()
            if s == 2:
                with torch.no_grad():  # an evaluation's forward between steps is not a step's
                    ddp.eval()
                    ddp(x)
                    ddp.train()
        log.record(test_accuracy=0.5)
        log.finish()
        finals[traced] = [p.detach().clone() for p in model.parameters()]
        if rank == 0:
            with open(os.path.join(root, "buckets"), "w") as f:
                f.write(str(len(state.buckets())))
    for a, b in zip(finals[False], finals[True]):
        check(torch.equal(a, b), "rank %d: tracing changed the parameters by up to %g" % (rank, (a - b).abs().max()))


def check_step_trace(root):
    folder = os.path.join(root, "traced", "topk-True")
    check(not os.path.exists(os.path.join(root, "traced", "topk-False", "steps.rank0.jsonl")),
          "an untraced run wrote a step trace")
    buckets = int(open(os.path.join(root, "buckets")).read())
    check(buckets > 2, "the model should have several buckets, DDP made %d" % buckets)
    layers = sum(1 for m in deep_mlp().modules() if isinstance(m, nn.Linear))
    for rank in range(WORLD):
        lines = open(os.path.join(folder, "steps.rank%d.jsonl" % rank)).read().splitlines()
        header, steps = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
        check(header["source"] == "pytorch" and header["rank"] == rank and header["world"] == WORLD,
              "header %s" % lines[0][:300])
        check(header["batch_size"] == 32 and header["layers"] == layers and header["compressor"] == "topk:ratio=0.01",
              "header %s" % lines[0][:300])
        tensors = header["tensors"]
        check([t["name"] for t in tensors[:2]] == ["0.weight", "0.bias"] and tensors[-1]["layer"] == layers - 1,
              "tensors %s" % tensors)
        check([st["step"] for st in steps] == list(range(5)), "steps %s" % [st["step"] for st in steps])
        for st in steps[1:]:  # after DDP rebuilt its buckets in the first step
            fwd = [c for c in st["compute"] if c["kind"] == "forward"]
            bwd = [c for c in st["compute"] if c["kind"] == "backward"]
            check([c["layer"] for c in fwd] == list(range(layers)), "forward layers %s" % [c["layer"] for c in fwd])
            check(len(bwd) == buckets == len(st["groups"]), "step %d: %d backward segments, %d groups, %d buckets"
                  % (st["step"], len(bwd), len(st["groups"]), buckets))
            for c, g in zip(bwd, st["groups"]):
                check(c["ready"] == [t for t, _ in g["chunks"]], "a group's tensors are not its bucket's: %s vs %s"
                      % (c["ready"], g["chunks"]))
                check(g["issue_s"] >= c["start_s"] + c["dur_s"] - 1e-6, "a bucket issued before it was ready")
                kinds = [p["kind"] for p in g["phases"]]
                check(kinds[0] == "compress" and kinds[-1] == "decompress" and "collective" in kinds, "phases %s" % kinds)
                ops = {p["op"] for p in g["phases"] if p["kind"] == "collective"}
                check(ops <= {"allgatherv", "allgather_sizes"} and all(
                    p["algorithm"] == "torch:gloo" for p in g["phases"] if p["kind"] == "collective"), "ops %s" % ops)
            check(sorted(t for c in bwd for t in c["ready"]) == list(range(len(tensors))), "not every tensor ready")
            check(sorted(u["tensor"] for u in st["updates"]) == list(range(len(tensors))), "updates %s" % st["updates"])
            last = max(c["start_s"] + c["dur_s"] for c in bwd)
            check(min(u["start_s"] for u in st["updates"]) >= last - 1e-6, "the optimizer ran before backward ended")
            check(st["step_s"] >= max(u["start_s"] + u["dur_s"] for u in st["updates"]) - 1e-6, "step_s too short")
        check(steps[3]["start_s"] > steps[2]["start_s"] + steps[2]["step_s"] - 1e-6, "steps overlap")
    out = subprocess.run([ARGS.terse, "whatif", folder, "--workers", "16", "--bandwidth", "10Gbps", "--latency", "5us",
                          "--json", "-"], check=True, capture_output=True, text=True).stdout
    result = json.loads(out[out.index("\n{") + 1:])
    check(result["workers"] == 16 and result["mean_step_s"] > 0, "whatif: %s" % out[-400:])
    print("step_trace: %d buckets, %d layers; whatif at 16 workers: %.2f ms per step" % (
        buckets, layers, 1e3 * result["mean_step_s"]))


# ---- accuracy against the native run


def accuracy(out):
    cfg = os.path.join(ARGS.source, "tests", "python", "ddp_recipe.textproto")
    example = os.path.join(ARGS.source, "experiments", "pytorch", "train_fashion_mnist.py")

    def final(name):
        lines = open(os.path.join(out, "ddp_hook", name, "metrics.jsonl")).read().splitlines()
        return json.loads(lines[-1])

    # Top-k + EF + DGC through the hook; local SGD (terse.torch.LocalSGD) against the native trainer's local SGD.
    for variant in ("topk-1pct-ef", "local-8", "qsr"):
        subprocess.run([ARGS.terse, "run", cfg, "--variant", variant, "--out", out], check=True,
                       stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, example, "--config", cfg, "--variant", variant, "--name", "torch-" + variant,
                        "--results", out], check=True, stdout=subprocess.DEVNULL)
        native, ours = final(variant), final("torch-" + variant)
        check(abs(native["test_accuracy"] - ours["test_accuracy"]) <= 0.01,
              "%s: PyTorch + hook ended at %.4f, terse run at %.4f: more than 1 point apart"
              % (variant, ours["test_accuracy"], native["test_accuracy"]))
        check(native["step"] == ours["step"], "%s: steps differ: native %d, hook %d" % (variant, native["step"],
                                                                                      ours["step"]))
        print("accuracy %s: terse run %.4f, PyTorch + hook %.4f (%d steps); payload per worker %d vs %d B" % (
            variant, native["test_accuracy"], ours["test_accuracy"], ours["step"], native["payload_bytes_per_worker"],
            ours["payload_bytes_per_worker"]))
    # Local SGD averages as often on both sides: 3 epochs of 125 steps, every 8th step and the evaluations' 125, 250
    # and 375 (none on the grid): 46 + 3 = 49 averagings of the f32 model.
    numel = 784 * 256 + 256 + 256 * 128 + 128 + 128 * 10 + 10
    sent = {name: final(name)["payload_bytes_per_worker"] for name in ("local-8", "torch-local-8")}
    check(set(sent.values()) == {49 * numel * 4}, "payload bytes %s, not 49 averagings of %d f32" % (sent, numel))
    # The quadratic synchronization rule draws the same rounds on both sides, from the rate of the step before each:
    # 20 gradient steps, the rule's averagings (terse.Recipe's schedule, the native trainer's) and the evaluations'
    # off it, each an exchange of the f32 model.
    recipe = terse.Recipe(cfg, variant="qsr")
    rounds = list(recipe.local_sgd_schedule(125, 375, 2))
    lengths = [b - a for a, b in zip([20] + rounds, rounds)]
    check(lengths[0] == 4 and lengths[-1] > 4 * lengths[0] and lengths == sorted(lengths),
          "the rule's rounds %s should lengthen from 4 as the rate decays" % lengths)
    exchanges = 20 + len(set(rounds) | {125, 250, 375})
    sent = {name: final(name)["payload_bytes_per_worker"] for name in ("qsr", "torch-qsr")}
    check(set(sent.values()) == {exchanges * numel * 4}, "qsr: payload bytes %s, not %d exchanges of %d f32 (rounds "
          "ending at %s)" % (sent, exchanges, numel, rounds))
    text = open(os.path.join(out, "ddp_hook", "torch-qsr", "config.textproto")).read()
    check("qsr_alpha: 0.1" in text and "start_step: 20" in text, "torch-qsr's config.textproto:\n%s" % text)
    print("accuracy qsr: rounds of %s steps" % lengths)
    table = subprocess.run([ARGS.terse, "compare", os.path.join(out, "ddp_hook"), "--format", "csv"], check=True,
                           capture_output=True, text=True).stdout
    rows = {line.split(",")[1] for line in table.splitlines() if "," in line}
    check({"topk-1pct-ef", "torch-topk-1pct-ef", "local-8", "torch-local-8"} <= rows,
          "`terse compare` does not list every run:\n%s" % table)


PROV_MODEL = """
import random
import numpy
import torch
import helpers
from pkg import width
class Counting(torch.nn.Linear):
    forwards = 0
    def forward(self, x):
        Counting.forwards += 1
        # Draws from every global generator, as a model's own augmentation might.
        return super().forward(x) + 0 * (random.random() + float(numpy.random.rand()) + float(torch.rand(1)))
def model():
    return Counting(width, 2)
def data(rank, world):
    return helpers.pairs(), helpers.pairs()
"""

PROV_HELPERS = """
import torch
def pairs():
    return torch.ones(8, 4), torch.zeros(8, dtype=torch.long)
"""


def provenance(tmp):
    import hashlib
    import numpy
    import terse.train as driver

    def sha(path):
        return hashlib.sha256(open(path, "rb").read()).hexdigest()

    mods = os.path.join(tmp, "mods")
    os.makedirs(os.path.join(mods, "pkg"))
    for name, text in (("model.py", PROV_MODEL), ("helpers.py", PROV_HELPERS), ("unused.py", "x = 1\n"),
                       ("pkg/__init__.py", "from .layers import width\n"), ("pkg/layers.py", "width = 4\n")):
        open(os.path.join(mods, name), "w").write(text)
    cfg = os.path.join(mods, "study.textproto")
    open(cfg, "w").write('study: "prov"\nworkload { name: "pytorch" pytorch { module: "model.py" } }\n'
                         'data { batch_size: 4 }\ncompressor { name: "none" }\n')
    # Run from another folder holding a file of the module's name, through a link to the module's folder: the
    # config's folder names the module, by its canonical path.
    elsewhere = os.path.join(tmp, "elsewhere")
    os.makedirs(elsewhere)
    open(os.path.join(elsewhere, "model.py"), "w").write("decoy = True\n")
    os.symlink(mods, os.path.join(tmp, "link"))
    os.chdir(elsewhere)
    main = os.path.realpath(os.path.join(mods, "model.py"))
    text = terse.Recipe(os.path.join("..", "link", "study.textproto")).text
    check('module: "%s"' % main in text, "terse.Recipe's text should name the module by its canonical path %s:\n%s"
          % (main, text))

    user = driver._load_module(main)
    model = user.model()
    train_x, train_y = user.data(0, 1)[0]
    # The check forward restores every global generator it drew from (the model's own count it cannot).
    random.seed(5)
    numpy.random.seed(6)
    torch.manual_seed(7)
    before = (random.getstate(), numpy.random.get_state(), torch.get_rng_state())
    spec = types.SimpleNamespace(pt={"module": main}, batch=4)
    examples = driver.TensorExamples(train_x, train_y)
    driver.check_fit(spec, model, (examples, examples), torch.device("cpu"), 0, 1)
    after = (random.getstate(), numpy.random.get_state(), torch.get_rng_state())
    check(after[0] == before[0], "check_fit left Python's random state changed")
    check(after[1][0] == before[1][0] and numpy.array_equal(after[1][1], before[1][1])
          and after[1][2:] == before[1][2:], "check_fit left numpy's random state changed")
    check(torch.equal(after[2], before[2]), "check_fit left torch's random state changed")
    check(user.Counting.forwards == 1, "the check forward ran %d forwards" % user.Counting.forwards)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    root = os.path.join(tmp, "results")

    def logged(variant, description):
        logger = terse.torch.ResultsLogger(root, study="prov", variant=variant, module=model, description=description)
        logger.record(0.5, step=1)
        logger.finish()
        return json.load(open(os.path.join(root, "prov", variant, "provenance.json")))

    # The module and what it imported from its folder (a sibling, a package), not unused.py nor the decoy.
    prov = logged("canonical", text)
    files = prov.get("module_files", {})
    expected = {name: sha(os.path.join(mods, name)) for name in ("model.py", "helpers.py", "pkg/__init__.py",
                                                                "pkg/layers.py")}
    check(files == expected, "module_files: %s, expected %s" % (files, expected))
    listing = "".join("%s  %s\n" % (expected[name], name) for name in sorted(expected))
    hook = prov.get("hook", {})
    check(hook.get("module_sha256") == expected["model.py"]
          and hook.get("module_files_sha256") == hashlib.sha256(listing.encode()).hexdigest(),
          "provenance.json's hook: %s" % hook)
    check("torchvision" not in hook, "torchvision recorded, but nothing imported it: %s" % hook)
    # A hand-written description naming the module relative to nothing: not the working directory's decoy.
    prov = logged("relative", 'workload { name: "pytorch" pytorch { module: "model.py" } }')
    hook = prov.get("hook", {})
    check(hook.get("module_sha256", "").startswith("not recorded: 'model.py' is relative")
          and "module_files" not in prov and "module_files_sha256" not in hook,
          "a relative module should be said not hashed: %s" % prov)
    import torchvision
    hook = logged("torchvision", "").get("hook", {})
    check(hook == {"torchvision": torchvision.__version__}, "torchvision's version: %s" % hook)
    dist.destroy_process_group()
    recipe_partition(tmp)


def recipe_partition(tmp):
    """terse.Recipe's batches of a non-IID config (data.partition DIRICHLET) are the native run's shards: each rank's
    label histogram is the one `terse run` records in provenance.json, the same every epoch; workload pytorch's
    driver trains on those labels (terse.train.epoch_order), not on its IID share's; Recipe.data_partition is the
    native provenance entry."""
    import numpy
    cfg = os.path.join(tmp, "noniid.textproto")
    open(cfg, "w").write('study: "noniid"\nworkload { name: "mlp" hidden_sizes: [8] }\n'
                         'data { batch_size: 50 train_subset: 2000 test_subset: 100 partition: DIRICHLET '
                         'dirichlet_alpha: 0.1 }\nworkers: 4\nepochs: 1\ncompressor { name: "none" }\n')
    out = os.path.join(tmp, "noniid_results")
    run = subprocess.run([ARGS.terse, "run", cfg, "--out", out], capture_output=True, text=True)
    check(run.returncode == 0, "terse run of the non-IID config failed: %s" % run.stderr[-2000:])
    native = json.load(open(os.path.join(out, "noniid", "base", "provenance.json")))["data_partition"]
    recipe = terse.Recipe(cfg)
    labels = recipe.data()[0][1]
    # workload pytorch's driver trains a rank on the examples terse.train.epoch_order gives, which for a DIRICHLET
    # config are the native shard, label for label; its IID share of the same data is not.
    from terse import train as driver
    spec = types.SimpleNamespace(recipe=recipe, partitioned=True)
    iid = types.SimpleNamespace(recipe=recipe, partitioned=False)
    for epoch in (0, 1):
        for rank in range(4):
            seen = numpy.concatenate(recipe.batches(rank, 4, epoch))
            counts = " ".join(str(int(k)) for k in numpy.bincount(labels[seen], minlength=10))
            check(counts == native["worker%d" % rank],
                  "epoch %d rank %d: the recipe's labels %s, the native run's %s" % (epoch, rank, counts,
                                                                                     native["worker%d" % rank]))
            own = driver.shard(len(labels), rank, 4)
            order = driver.epoch_order(spec, own, rank, 4, epoch, torch.Generator().manual_seed(epoch))
            trained = " ".join(str(int(k)) for k in numpy.bincount(labels[order.numpy()], minlength=10))
            check(order.dtype == torch.int64 and trained == native["worker%d" % rank],
                  "epoch %d rank %d: the driver trains on labels %s, the native shard holds %s"
                  % (epoch, rank, trained, native["worker%d" % rank]))
            shuffled = driver.epoch_order(iid, own, rank, 4, epoch, torch.Generator().manual_seed(epoch))
            check(" ".join(str(int(k)) for k in numpy.bincount(labels[shuffled.numpy()], minlength=10)) != trained,
                  "epoch %d rank %d: the IID share has the non-IID shard's labels" % (epoch, rank))
    # What a PyTorch run's ResultsLogger records (data_partition=): the native run's entry, key for key.
    recorded = dict(recipe.data_partition(4))
    check(recorded == native, "terse.Recipe.data_partition(4) %s, the native run's %s" % (recorded, native))
    check(recipe.data_partition(4) == recipe.data_partition(4) and terse.Recipe(
        os.path.join(ARGS.source, "experiments", "configs", "quickstart.textproto"), "dense").data_partition(4) == [],
        "an IID config's data_partition is empty")


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["equivalence", "overlap", "api", "logger", "payload_bytes", "errors",
                                    "one_rank_fails", "plugin_hangs", "layout", "step_trace", "accuracy",
                                    "variable_size", "chained_order", "in_place", "chained_one_round",
                                    "settle_later", "unused_parameters", "disagree", "provenance",
                                    "dense_warmup"])
    p.add_argument("--terse", required=True, help="the terse binary")
    p.add_argument("--source", required=True, help="the source tree")
    p.add_argument("--fixture-plugins", required=True)
    p.add_argument("--runner-plugins", required=True)
    p.add_argument("--fixture-dir", required=True, help="tests/fixtures' plugins (misbehave)")
    p.add_argument("--test-plugins", required=True, help="tests/plugins' working plugins (test_rounds)")
    ARGS = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if ARGS.case == "equivalence":
            spawn(equivalence)
        elif ARGS.case == "overlap":
            spawn(overlap)
        elif ARGS.case == "chained_order":
            spawn(chained_order, timeout_s=20, world=3)
        elif ARGS.case == "in_place":
            spawn(in_place, timeout_s=20, world=3)
        elif ARGS.case == "chained_one_round":
            spawn(chained_one_round, timeout_s=20, world=3)
        elif ARGS.case == "settle_later":
            spawn(settle_later, timeout_s=20, world=3)
            spawn(settle_order, timeout_s=20, world=1)
        elif ARGS.case == "unused_parameters":
            spawn(unused_parameters)
        elif ARGS.case == "disagree":
            spawn(disagree, timeout_s=20)
        elif ARGS.case == "api":
            spawn(api)
        elif ARGS.case == "logger":
            spawn(logger, tmp)
            check_logger(tmp)
        elif ARGS.case == "payload_bytes":
            path = os.path.join(tmp, "payload.json")
            spawn(payload_bytes, path)
            check_payload_bytes(path)
        elif ARGS.case == "errors":
            spawn(errors)
        elif ARGS.case == "plugin_hangs":
            spawn_hanging(tmp, overlap="thread")
            for mode in (True, False):
                with tempfile.TemporaryDirectory() as tmp2:
                    spawn_hanging(tmp2, overlap=mode)
        elif ARGS.case == "one_rank_fails":
            spawn_failing(tmp)
        elif ARGS.case == "step_trace":
            spawn(step_trace, tmp)
            check_step_trace(tmp)
        elif ARGS.case == "layout":
            os.environ["TERSE_LOG_LEVEL"] = "info"  # the workers' (rebuild_log reads an info line)
            spawn(layout, os.path.join(tmp, "store2"))
        elif ARGS.case == "variable_size":
            spawn(variable_size)
        elif ARGS.case == "dense_warmup":
            spawn(dense_warmup, tmp)
        elif ARGS.case == "provenance":
            provenance(tmp)
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
