"""terse.torch.LocalSGD and local_sgd_hook (experiments/python/terse/local_sgd.py) with DDP processes (gloo, CPU),
one ctest case per subcommand (tests/python/CMakeLists.txt):

  exact      2 ranks, then 3: a warm-up of gradient steps through the hook, then local steps and averagings every 3
             steps, with momentum: the parameters equal a reference written here in plain torch.distributed (all_reduce
             of the gradients, then of the deltas anchor - value) after every step, bit for bit with 2 ranks; the
             replicas differ between averagings and agree after each; a forced averaging (step(average=True)) off
             the grid; the state counts the averagings' payload apart from the gradient steps'; DiLoCo's outer
             Nesterov momentum equals its formula; the quadratic synchronization rule's rounds under a decaying rate,
             with and without DDP, equal the reference's; top-k 10% + EF (Qsparse-local-SGD) ends with replicas that
             agree and a loss below the start's
  logger     ResultsLogger(state=LocalSGD): config.textproto's local_sgd block, the steps of metrics.jsonl, and the
             averagings' bytes; a description's local_sgd block is cleared for a run without LocalSGD
  buffers    BatchNorm statistics: DDP's buffer broadcast is off from start_step on, the replicas' statistics differ
             between averagings and agree after each, counted apart; a non-persistent buffer is left alone, an f64
             one averaged, one DDP ignores kept; a 0-d parameter; SyncBatchNorm refused
  failures   a NaN on rank 1 alone: every rank's averaging refuses before any compressor call, naming rank 1, within
             seconds, with nothing averaged; the next step raises again; the ranks stay paired; ranks whose rates
             differ under the quadratic synchronization rule raise at their first averaging, naming both; the same
             for an infinite BatchNorm statistic, and the logger's folder says failed
  trace      step traces (step_trace=True) of a run with gradient steps, local steps and averagings, BatchNorm
             statistics among them: the parameters equal an untraced run's bit for bit; the gradient steps hold DDP's
             buckets as groups, the local steps computation and optimizer only, each averaging a group of the
             finiteness check, one of the deltas (every parameter) and one of the statistics' allreduce, after the
             step's backward, their time outside the optimizer's; terse whatif replays the folder at 2 workers between
             each rank's own time and the slower rank's, and at 256 workers on 100 Mbps slows the averaging steps
             alone; replicas that drift apart (rank 1 10 ms slower a step) replay at most 10% over the run's wall time
             (and not a quarter under); an evaluation of the inner model ends the step (its time is no optimizer's);
             a traced LocalSGD whose backward never reaches the hook (no local_sgd_hook) is refused at its first step
  refusals   bad settings (qsr_alpha without an optimizer among them; a rising rate cuts a round), a CUSTOM compressor
             (signsgd), DGC momentum correction, error feedback and a stateful compressor (PowerSGD) after a warm-up,
             each refused naming it; ranks whose settings differ, and replicas that differ at the start (no DDP, one
             seed per rank), raise InvalidArgument on every rank naming each rank's, and nobody hangs, also where one
             rank alone refuses; a ResultsLogger built on the state first; terse.local_sgd imported first
"""

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import terse
import terse.torch
from checks import check, expect_error  # tests/python/checks.py, beside this file


def mlp(seed=1):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(40, 24), nn.ReLU(), nn.Linear(24, 7), nn.ReLU(), nn.Linear(7, 5))


def batch(step, rank, n=16):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(n, 40, generator=g), torch.randint(0, 5, (n,), generator=g)


def sgd_step(net, opt, step, rank):
    """One training step of `net` (the model or its DDP wrapper) on this rank's batch of `step`; returns the batch."""
    x, y = batch(step, rank)
    opt.zero_grad()
    F.cross_entropy(net(x), y).backward()
    opt.step()
    return x, y


def spawn(fn, *extra, world=2, timeout_s=30):
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_run, args=(fn, os.path.join(tmp, "store"), timeout_s, world) + extra, nprocs=world)


def _run(rank, fn, store, timeout_s, world, *extra):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        fn(rank, *extra)
    finally:
        dist.destroy_process_group()


def gathered(model):
    """Every rank's parameters, flattened, as a list (one per rank)."""
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    every = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(every, flat)
    return every


def agree(model):
    every = gathered(model)
    return all(torch.equal(every[0], t) for t in every[1:])


class Reference:
    """Local SGD in plain torch.distributed, as the module's text states it: gradients averaged before start_step, the
    rank's own after; every `period` steps from start_step value = anchor - mean(anchor - value), or with an outer
    momentum u = m u + d, value = anchor - lr (d + m u) (Nesterov)."""

    def __init__(self, model, period, start_step, lr, momentum, outer_lr=1.0, outer_momentum=0.0, nesterov=False,
                 ends=None):
        self.ends = ends  # the step counts that end a round (the quadratic synchronization rule's); None: the period's
        self.model = model
        self.opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum)
        self.period, self.start = period, start_step
        self.outer_lr, self.outer_m, self.nesterov = outer_lr, outer_momentum, nesterov
        self.steps = 0
        self.anchor = [p.detach().clone() for p in model.parameters()] if start_step == 0 else None
        self.u = [torch.zeros_like(p) for p in model.parameters()]

    def step(self, x, y, average=False):
        world = dist.get_world_size()
        self.opt.zero_grad()
        F.cross_entropy(self.model(x), y).backward()
        if self.steps < self.start:
            for p in self.model.parameters():
                dist.all_reduce(p.grad)
                p.grad.div_(world)
        self.opt.step()
        self.steps += 1
        with torch.no_grad():
            if self.steps == self.start:
                self.anchor = [p.detach().clone() for p in self.model.parameters()]
            elif self.steps > self.start and (average or (self.steps in self.ends if self.ends is not None else
                                                          (self.steps - self.start) % self.period == 0)):
                for p, a, u in zip(self.model.parameters(), self.anchor, self.u):
                    d = a - p
                    dist.all_reduce(d)
                    d.div_(world)
                    if self.outer_m == 0 and self.outer_lr == 1:
                        a.sub_(d)
                    else:
                        u.mul_(self.outer_m).add_(d)
                        a.sub_(d.add(u, alpha=self.outer_m) if self.nesterov else u, alpha=self.outer_lr)
                    p.copy_(a)


def train_local(rank, state_kw, local_kw, steps, forced=(), momentum=0.9, ref_kw=None, hook=True, overlap=False,
                rates=None):
    """Trains mlp() through DDP + local_sgd_hook (or, hook=False, without DDP) and, beside it, the Reference;
    returns the LocalSGD, the model and a list per step of (parameters equal the reference's, replicas agree).
    `rates(step)`: each step's learning rate, set before it on both (else 0.05 throughout)."""
    model = mlp()
    # Without the hook no DDP either (DDP would allreduce the local steps' gradients): the module itself, whose
    # replicas start alike from one seed.
    ddp = nn.parallel.DistributedDataParallel(model) if hook else model
    state = terse.torch.CompressionState(module=model, overlap=overlap, **state_kw)
    local = terse.torch.LocalSGD(state, model, **local_kw)
    if hook:
        ddp.register_comm_hook(local, terse.torch.local_sgd_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=momentum)
    local.optimizer = opt
    ref = None
    if ref_kw is not None:
        ref = Reference(mlp(), local_kw["period"], local_kw.get("start_step", 0), 0.05, momentum, **ref_kw)
    seen = []
    for s in range(steps):
        if rates is not None:
            for o in [opt] + ([ref.opt] if ref is not None else []):
                for group in o.param_groups:
                    group["lr"] = rates(s)
        x, y = sgd_step(ddp, opt, s, rank)
        local.step(average=s + 1 in forced)
        if ref is not None:
            ref.step(x, y, average=s + 1 in forced)
            # Bit for bit with 2 ranks (a sum of two commutes); with more, gloo's sums of a bucket and of a parameter
            # may add in other orders.
            tol = 0.0 if dist.get_world_size() == 2 else 1e-6
            same = all(torch.allclose(p, q, rtol=0, atol=tol) for p, q in zip(model.parameters(),
                                                                              ref.model.parameters()))
        else:
            same = None
        seen.append((same, agree(model)))
    return local, model, seen


def exact(rank):
    # Plain averaging after a warm-up of 2 gradient steps, period 3, with a forced averaging after step 7; the warm-up's
    # buckets through each of the hook's paths (inside the hook, chained, on the worker thread).
    for overlap in (True, "thread", False):
        local, model, seen = train_local(rank, {"compressor": "none"}, {"period": 3, "start_step": 2}, 12,
                                         forced=(7,), ref_kw={}, overlap=overlap)
        averaged = {5, 7, 8, 11}  # after steps 2 + 3k, and the forced one
        for s, (same, agreed) in enumerate(seen, start=1):
            check(same, "overlap=%r, step %d: the parameters differ from the reference's" % (overlap, s))
            if s <= 2 or s in averaged:
                check(agreed, "overlap=%r, step %d: the replicas differ after a gradient step or an averaging"
                      % (overlap, s))
            else:
                check(not agreed, "overlap=%r, step %d: the replicas agree after a local step" % (overlap, s))
    check(local.averagings == 4 and local.steps == 12, "averagings %d, steps %d" % (local.averagings, local.steps))
    buckets = local.compression.buckets()
    # The gradient steps' buckets (DDP's indices) and the averagings' one buffer (f32), apart.
    mine = {i: b for i, b in buckets.items() if i >= 1 << 20}
    check(len(mine) == 1 and mine[1 << 20]["steps"] == 4,
          "the averagings' byte counts: %s" % {i: b["steps"] for i, b in buckets.items()})
    numel = sum(p.numel() for p in model.parameters())
    check(mine[1 << 20]["total"]["payload"] == 4 * numel * 4,
          "the averagings' payload %d B, expected 4 x %d f32" % (mine[1 << 20]["total"]["payload"], numel))
    grads = sum(b["steps"] for i, b in buckets.items() if i < 1 << 20)
    check(grads >= 2, "the warm-up's gradient buckets went through the state: %s" % buckets)

    # The outer step, from the first step, against the reference's formula: DiLoCo's Nesterov momentum, SlowMo's heavy
    # ball, and a rate alone.
    for outer in ({"outer_lr": 0.7, "outer_momentum": 0.9, "outer_nesterov": True},
                  {"outer_lr": 0.5, "outer_momentum": 0.6}, {"outer_lr": 1.5}):
        ref = {"outer_lr": outer["outer_lr"], "outer_momentum": outer.get("outer_momentum", 0.0),
               "nesterov": outer.get("outer_nesterov", False)}
        _, _, seen = train_local(rank, {"compressor": "none"}, dict(period=2, **outer), 8, momentum=0.0, ref_kw=ref,
                                 hook=False)
        for s, (same, agreed) in enumerate(seen, start=1):
            check(same, "%s, step %d: the parameters differ from the reference's" % (outer, s))
            check(agreed == (s % 2 == 0), "%s, step %d: replicas agree %s" % (outer, s, agreed))

    # The quadratic synchronization rule as its paper states it, against the reference: a round begun after d steps
    # lasts max(period, floor((alpha / lr)^2)) steps, lr the rate of step d - 1 (of step 0 for the first). The rate
    # halves after steps 8 and 12: rounds of 4 (0.1 / 0.05, squared) to 12 -- the one begun after 8 steps takes step
    # 7's 0.05, not step 8's 0.025 --, then at step 11's 0.025 one of 16, past the 26 steps; a forced averaging after
    # step 10 moves nothing.
    def rates(step):
        return 0.05 if step < 8 else 0.025 if step < 12 else 0.0125

    ends, d = [], 0
    while True:
        q = 0.1 / rates(max(d - 1, 0))
        d += max(2, math.floor(q * q))
        if d > 26:
            break
        ends.append(d)
    check(ends == [4, 8, 12], "the reference's rounds end at %s" % ends)
    for hook in (True, False):
        local, _, seen = train_local(rank, {"compressor": "none"}, {"period": 2, "qsr_alpha": 0.1}, 26, forced=(10,),
                                     ref_kw={"ends": set(ends)}, hook=hook, rates=rates)
        for s, (same, agreed) in enumerate(seen, start=1):
            check(same, "qsr, hook=%s, step %d: the parameters differ from the reference's" % (hook, s))
            check(agreed == (s in (4, 8, 10, 12)), "qsr, hook=%s, step %d: replicas agree %s" % (hook, s, agreed))
        check(local.averagings == 4, "qsr: %d averagings" % local.averagings)

    # Qsparse-local-SGD: top-k 10% of each delta with error feedback, no DDP hook at all (start_step 0).
    torch.manual_seed(3)
    x, y = batch(999, 0, n=64)
    model0 = mlp()
    start = F.cross_entropy(model0(x), y).item()
    local, model, seen = train_local(rank, {"compressor": "topk", "ratio": 0.1, "error_feedback": True},
                                     {"period": 4}, 40, momentum=0.0, hook=False)
    check(all(agreed == (s % 4 == 0) for s, (_, agreed) in enumerate(seen, start=1)),
          "top-k + EF: the replicas agree at %s" % [s for s, (_, a) in enumerate(seen, start=1) if a])
    end = F.cross_entropy(model(x), y).item()
    check(end < start, "top-k + EF local SGD: loss %.4f after 40 steps, %.4f at the start" % (end, start))
    totals = local.compression.totals()
    check(0 < totals["payload"] < 10 * sum(p.numel() for p in model.parameters()) * 4 * 0.5,
          "top-k 10%% of 10 averagings: %d payload bytes" % totals["payload"])


def logger(rank, root):
    model = mlp()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = terse.torch.CompressionState("fp16", module=model)
    local = terse.torch.LocalSGD(state, model, period=4, start_step=3)
    ddp.register_comm_hook(local, terse.torch.local_sgd_hook)
    log = terse.torch.ResultsLogger(root, study="ls", variant="local", state=local,
                                    description="local_sgd { period: 99 }\nepochs: 1")
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for s in range(11):
        sgd_step(ddp, opt, s, rank)
        local.step(average=s + 1 == 11)
        if s + 1 in (5, 11):
            log.record(test_accuracy=0.5, epoch=(s + 1) / 11)
    log.finish()
    state.close()
    # A description's local_sgd block, for a run without LocalSGD: the run was synchronous.
    plain = terse.torch.CompressionState("fp16", module=model)
    log = terse.torch.ResultsLogger(root, study="ls", variant="sync", state=plain,
                                    description="local_sgd { period: 99 }\nepochs: 1")
    log.record(test_accuracy=0.5, step=0)
    log.finish()


def check_logger(root):
    text = open(os.path.join(root, "ls", "local", "config.textproto")).read()
    for line in ("period: 4", "start_step: 3", "outer_lr: 1"):
        check(line in text, "config.textproto lacks %r:\n%s" % (line, text))
    check("period: 99" not in text, "the description's period stayed:\n%s" % text)
    records = [json.loads(line) for line in open(os.path.join(root, "ls", "local", "metrics.jsonl"))]
    check([r["step"] for r in records] == [5, 11], "metrics steps %s" % [r["step"] for r in records])
    # Bytes: 3 gradient steps of fp16 (2 B a parameter and a header a tensor) by step 5, nothing for the local steps,
    # then the averaging after step 7 and the forced one after step 11, of fp16 deltas: 3, then 5 exchanges alike.
    numel = sum(p.numel() for p in mlp().parameters())
    payloads = [r["payload_bytes_per_worker"] for r in records]
    one = payloads[0] // 3
    check(payloads == [3 * one, 5 * one] and 2 * numel <= one < 2 * numel + 64 * 6,
          "payload bytes %s: not 3 and 5 exchanges of fp16's %d parameters" % (payloads, numel))
    text = open(os.path.join(root, "ls", "sync", "config.textproto")).read()
    check("local_sgd" not in text, "a run without LocalSGD kept the description's local_sgd:\n%s" % text)


def refusals(rank):
    model = mlp()
    none = terse.torch.CompressionState("none", module=model)
    for kw, fragment in (({"period": 0}, "'period' must be an integer >= 1"),
                         ({"period": 2.0}, "'period' must be an integer >= 1"),
                         ({"period": 2, "start_step": -1}, "'start_step' must be an integer >= 0"),
                         ({"period": 2, "outer_lr": 0.0}, "'outer_lr' must be finite and in (0, 100]"),
                         ({"period": 2, "outer_lr": float("nan")}, "'outer_lr' must be finite"),
                         ({"period": 2, "outer_momentum": 1.0}, "'outer_momentum' must be in [0, 1)"),
                         ({"period": 2, "outer_nesterov": True}, "outer_nesterov=True needs outer_momentum > 0"),
                         ({"period": 2, "qsr_alpha": -0.1}, "'qsr_alpha' must be finite and >= 0"),
                         ({"period": 2, "optimizer": "sgd"}, "'optimizer' must be a torch.optim.Optimizer")):
        expect_error(terse.InvalidArgument, fragment, lambda: terse.torch.LocalSGD(none, model, **kw))
    expect_error(terse.InvalidArgument, "must be a terse.torch.CompressionState",
                 lambda: terse.torch.LocalSGD(model, model, period=2))
    for state_kw, local_kw, fragment in (
            ({"compressor": "signsgd"}, {}, "compressor 'signsgd' aggregates with its own reduce (CUSTOM"),
            ({"compressor": "topk", "ratio": 0.01, "momentum_correction": 0.9}, {}, "momentum_correction 0.9"),
            ({"compressor": "topk", "ratio": 0.01, "error_feedback": True, "error_feedback_rule": "ef21"}, {},
             "the state's error_feedback_rule 'ef21' keeps estimates of each rank's gradient"),
            ({"compressor": "topk", "ratio": 0.01, "error_feedback": True}, {"start_step": 5},
             "error feedback with start_step 5"),
            ({"compressor": "topk", "ratio": 0.01, "compression_start_step": 4}, {},
             "the state's compression_start_step 4 is a dense warm-up of gradient steps"),
            ({"compressor": "powersgd", "rank": 2}, {"start_step": 5}, "compressor 'powersgd' keeps state")):
        state = terse.torch.CompressionState(module=model, **state_kw)
        expect_error(terse.InvalidArgument, fragment,
                     lambda: terse.torch.LocalSGD(state, model, period=2, **local_kw))
    # Stateful or with error feedback from the first step: Qsparse-local-SGD and PowerSGD on deltas are fine.
    terse.torch.LocalSGD(terse.torch.CompressionState("powersgd", rank=2, module=model), model, period=2)

    # Ranks whose settings differ: every rank raises, naming each rank's period and nothing else.
    message = expect_error(terse.InvalidArgument, "the ranks' LocalSGD settings differ: rank 0: period=2; rank 1: "
                           "period=3;", lambda: terse.torch.LocalSGD(none, model, period=2 + rank))
    check("start_step" not in message, "the message names settings that agree: %s" % message)
    # A rank that refuses alone (error feedback after a warm-up on rank 1 only) makes every rank raise, naming it.
    ef = terse.torch.CompressionState("topk", ratio=0.1, error_feedback=True, module=model)
    start = time.monotonic()
    message = expect_error(terse.InvalidArgument, "the ranks' LocalSGD settings differ",
                           lambda: terse.torch.LocalSGD(ef, model, period=2, start_step=3 * rank))
    check("start_step=0" in message and "start_step=3" in message and "error feedback with start_step 3" in message
          and time.monotonic() - start < 5, "a one-rank refusal: %s" % message)
    # A logger built on the state before the LocalSGD would count the state's steps: refused. One built after, on the
    # state, logs the LocalSGD.
    with tempfile.TemporaryDirectory() as root:
        logged = terse.torch.CompressionState("none", module=model)
        terse.torch.ResultsLogger(root, study="s", state=logged)
        expect_error(terse.InvalidArgument, "a ResultsLogger already logs this CompressionState",
                     lambda: terse.torch.LocalSGD(logged, model, period=2))
        later = terse.torch.CompressionState("none", module=model)
        local = terse.torch.LocalSGD(later, model, period=2)
        check(terse.torch.ResultsLogger(root, study="t", state=later)._local is local,
              "a logger of the state does not log its LocalSGD")
    # Replicas that differ at the start: no DDP, a seed per rank.
    other = mlp(seed=10 + rank)
    state = terse.torch.CompressionState("none", module=other)
    expect_error(terse.InvalidArgument, "the replicas differ when local SGD starts (after 0 steps)",
                 lambda: terse.torch.LocalSGD(state, other, period=2))
    # The same seed: accepted, and the first averaging goes through.
    same = mlp(seed=4)
    local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=same), same, period=1)
    with torch.no_grad():
        for p in same.parameters():
            p.add_(float(rank))
    check(local.step(), "period 1 averages at the first step")
    check(agree(same), "the replicas agree after an averaging")
    # The quadratic synchronization rule without an optimizer to read the rate from: refused at the first step, on
    # every rank alike, before any collective.
    local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=same), same, period=2, qsr_alpha=0.1)
    expect_error(terse.InvalidArgument, "LocalSGD: qsr_alpha=0.1 reads the optimizer's learning rate when each round "
                 "begins; give LocalSGD(..., optimizer=opt)", local.step)
    # Over a warm-up the rule would draw its first round from the smallest rate and never average: a rate that rises
    # inside a round cuts it to what that rate asks for, from the round's start (0.05 after step 2: 4 steps).
    opt = torch.optim.SGD(same.parameters(), lr=0.001)
    local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=same), same, period=2, qsr_alpha=0.1,
                                 optimizer=opt)
    averaged = [local.step()]  # a round of 10,000 steps
    opt.param_groups[0]["lr"] = 0.05
    averaged += [local.step() for _ in range(3)]
    check(averaged == [False, False, False, True], "a warm-up's rounds: averaged after steps %s"
          % [s for s, a in enumerate(averaged, start=1) if a])
    # The native schedule's own case (LocalSgd.QsrRoundsLengthenAsTheRateDecays): a warm-up from 0.001 by 0.01 a step
    # to 0.1, alpha 0.4, period 2: the first round cut step by step to 16, then rounds of 16.
    opt = torch.optim.SGD(same.parameters(), lr=0.001)
    local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=same), same, period=2, qsr_alpha=0.4,
                                 optimizer=opt)
    ends = []
    for s in range(60):
        opt.param_groups[0]["lr"] = 0.001 + 0.1 * s / 10 if s < 10 else 0.1
        if local.step():
            ends.append(s + 1)
    check(ends == [16, 32, 48], "a warm-up's rounds end after %s, natively after 16, 32 and 48" % ends)


class BnNet(nn.Module):
    """mlp() with a BatchNorm: running statistics are persistent buffers, a non-persistent one is derived."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(1)
        self.fc = nn.Linear(40, 24)
        self.bn = nn.BatchNorm1d(24)
        self.out = nn.Linear(24, 5)
        self.register_buffer("scale", torch.ones(24), persistent=False)

    def forward(self, x):
        return self.out(F.relu(self.bn(self.fc(x)) * self.scale))


def buffers(rank):
    """The local steps send nothing: DDP's buffer broadcast is off from start_step on, so each replica's BatchNorm
    statistics follow its own batches, and each averaging averages them (counted) with the deltas."""
    model = BnNet()
    ddp = nn.parallel.DistributedDataParallel(model)
    state = terse.torch.CompressionState("topk", ratio=0.5, module=model, overlap=False)
    local = terse.torch.LocalSGD(state, ddp, period=3, start_step=2)
    ddp.register_comm_hook(local, terse.torch.local_sgd_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def stats():
        flat = torch.cat([model.bn.running_mean, model.bn.running_var])
        every = [torch.empty_like(flat) for _ in range(2)]
        dist.all_gather(every, flat)
        return torch.equal(every[0], every[1])

    seen = []
    for s in range(8):
        sgd_step(ddp, opt, s, rank)
        local.step()
        seen.append((ddp.broadcast_buffers, stats()))
    # Steps 1-2 synchronous (DDP broadcasts rank 0's statistics before each forward, each rank then updates them with
    # its own batch: they differ after the step); local from step 3, averaged after steps 5 and 8.
    check([b for b, _ in seen] == [True, False, False, False, False, False, False, False],
          "DDP's broadcast_buffers by step: %s" % [b for b, _ in seen])
    check([a for _, a in seen] == [False, False, False, False, True, False, False, True],
          "BatchNorm statistics agree by step: %s" % [a for _, a in seen])
    counted = local.compression.buckets()[(1 << 20) + 1]
    check(counted["steps"] == 2 and counted["total"]["payload"] == 2 * 48 * 4,
          "the statistics' averagings: %s (2 of 48 f32)" % counted)
    check(torch.equal(model.scale, torch.ones(24)), "the non-persistent buffer was touched")

    # An f64 buffer is averaged too (in f32); one DDP ignores stays the rank's own; a 0-d parameter is averaged and
    # the driver's check of the replicas reads it.
    from terse import train as driver
    net = BnNet()
    net.register_buffer("f64", torch.full((3,), float(rank), dtype=torch.float64))
    net.register_buffer("mine", torch.full((2,), float(rank)))
    net.temperature = nn.Parameter(torch.tensor(1.0))
    nn.parallel.DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(net, ["mine"])
    local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=net, overlap=False), net, period=1)
    with torch.no_grad():
        net.temperature.add_(float(rank))  # a local step's change
    check(not driver.replicas_agree(local.parameters, 2, torch.device("cpu")), "rank-dependent temperatures agreed")
    local.step()
    check(torch.equal(net.f64, torch.full((3,), 0.5, dtype=torch.float64)), "the f64 buffer: %s" % net.f64)
    check(torch.equal(net.mine, torch.full((2,), float(rank))), "an ignored buffer was averaged: %s" % net.mine)
    check(driver.replicas_agree(local.parameters, 2, torch.device("cpu")), "the replicas differ after an averaging")
    # A SyncBatchNorm would all-gather its batch statistics in every local step.
    synced = nn.SyncBatchNorm.convert_sync_batchnorm(BnNet())
    expect_error(terse.InvalidArgument, "the module has a SyncBatchNorm",
                 lambda: terse.torch.LocalSGD(terse.torch.CompressionState("none", module=synced), synced, period=2))


def failures(rank):
    """A replica that diverged alone (a NaN on rank 1) fails every rank's averaging, naming it, before any compressor
    sees it: no rank is left in a collective, and every later step raises again."""
    for compressor, kw in (("topk", {"ratio": 0.1, "error_feedback": True}), ("none", {})):
        model = mlp()
        state = terse.torch.CompressionState(compressor, module=model, overlap=False, **kw)
        local = terse.torch.LocalSGD(state, model, period=2)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for s in range(2):
            sgd_step(model, opt, s, rank)
            if s == 1 and rank == 1:
                with torch.no_grad():
                    model[2].weight[0, 0] = float("nan")
            if s == 0:
                local.step()
        start = time.monotonic()
        message = expect_error(terse.InvalidArgument, "the model of rank 1 holds a non-finite value (in its parameters "
                               "or its buffers) after step 2",
                               local.step)
        check(time.monotonic() - start < 5, "%s: the refusal took %.1f s" % (compressor, time.monotonic() - start))
        check(local.compression.totals()["payload"] == 0, "%s: something was averaged: %s"
              % (compressor, local.compression.totals()))
        expect_error(terse.InvalidArgument, "an earlier averaging failed", local.step)
        # The ranks are still paired: a collective after the refusal completes on both.
        t = torch.ones(1)
        dist.all_reduce(t)
        check(t.item() == 2, "the ranks fell out of step after the refusal")
        del message
    # Ranks whose learning rates differ under the quadratic synchronization rule draw different rounds (rank 0 of 4
    # steps at 0.05, rank 1 of 6 at 0.04): the first averaging's check pairs rank 0's after step 4 with rank 1's after
    # step 6, and both raise naming the two, rather than averaging a model with a later one.
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05 if rank == 0 else 0.04)
    local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=model, overlap=False), model, period=2,
                                 qsr_alpha=0.1, optimizer=opt)
    start = time.monotonic()
    raised = None
    for s in range(6):
        sgd_step(model, opt, s, rank)
        try:
            local.step()
        except terse.InvalidArgument as e:
            raised = (s + 1, str(e))
            break
    check(raised is not None and raised[0] == (4 if rank == 0 else 6) and "rank 0 after step 4, lr 0.05; rank 1 "
          "after step 6, lr 0.04" in raised[1] and time.monotonic() - start < 10,
          "rank %d: ranks with different rates: %s" % (rank, raised))
    # A BatchNorm statistic that overflowed on rank 1 alone (an fp16 forward under AMP does it while the scaler skips
    # the step): refused too, and a logger of the run marks it failed.
    with tempfile.TemporaryDirectory() as root:
        net = BnNet()
        local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=net, overlap=False), net, period=1)
        log = terse.torch.ResultsLogger(root, study="s", state=local)
        sgd_step(net, torch.optim.SGD(net.parameters(), lr=0.05), 0, rank)
        if rank == 1:
            net.bn.running_var[0] = float("inf")
        expect_error(terse.InvalidArgument, "the model of rank 1 holds a non-finite value (in its parameters or its "
                     "buffers)", local.step)
        log.finish()
        if rank == 0:
            status = json.load(open(os.path.join(root, "s", "none", "status.json")))
            check(status["state"] == "failed" and "non-finite" in status["error"], "status.json: %s" % status)


def trace(rank, root):
    """Two gradient steps, then local steps averaged after steps 5 and 8, of a model with BatchNorm statistics; the
    same run untraced, then traced."""
    dist._DEFAULT_FIRST_BUCKET_BYTES = 256
    finals = {}
    for traced in (False, True):
        model = BnNet()
        # Three buckets once DDP rebuilt them after step 0 (one before).
        ddp = nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)
        state = terse.torch.CompressionState("topk", ratio=0.25, module=ddp, overlap=False, step_trace=traced)
        local = terse.torch.LocalSGD(state, ddp, period=3, start_step=2)
        ddp.register_comm_hook(local, terse.torch.local_sgd_hook)
        log = terse.torch.ResultsLogger(root, study="traced", variant="local-%s" % traced, state=local)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        for s in range(9):
            sgd_step(ddp, opt, s, rank)
            local.step()
            time.sleep(0.002)  # the rest of a script's step (its data loader): an optimizer gap worth measuring
            if s == 5:
                # An evaluation of the inner model (not through the wrapper the state traces) ends the step: the
                # 50 ms after it are no step's.
                with torch.no_grad():
                    model.eval()
                    model(batch(s, rank)[0])
                    model.train()
                time.sleep(0.05)
        log.record(test_accuracy=0.5)
        log.finish()
        finals[traced] = [p.detach().clone() for p in model.parameters()] + [model.bn.running_mean.clone()]
    for a, b in zip(finals[False], finals[True]):
        check(torch.equal(a, b), "rank %d: tracing changed the model by up to %g" % (rank, (a - b).abs().max()))
    # Replicas that drift apart: rank 1's forward takes 10 ms more, so rank 0 waits for it at each averaging's first
    # collective; the wall time of the run, for check_trace.
    model = mlp()
    if rank == 1:
        model.register_forward_pre_hook(lambda m, inputs: time.sleep(0.01))
    ddp = nn.parallel.DistributedDataParallel(model)
    local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=ddp, overlap=False, step_trace=True),
                                 ddp, period=4)
    ddp.register_comm_hook(local, terse.torch.local_sgd_hook)
    log = terse.torch.ResultsLogger(root, study="traced", variant="skewed", state=local)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    dist.barrier()
    start = time.perf_counter()
    for s in range(12):
        sgd_step(ddp, opt, s, rank)
        local.step()
    wall = time.perf_counter() - start
    log.record(test_accuracy=0.5)
    log.finish()
    if rank == 0:
        with open(os.path.join(root, "wall"), "w") as f:
            f.write(repr(wall))
    # Without local_sgd_hook (the module trained without DDP), no backward reaches the trace: refused at once.
    model = mlp()
    local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=model, step_trace=True), model, period=2)
    sgd_step(model, torch.optim.SGD(model.parameters(), lr=0.05), 0, rank)
    expect_error(terse.InvalidArgument, "the state records a step trace, and step 1's backward did not reach it",
                 local.step)


def check_trace(root, terse_bin):
    folder = os.path.join(root, "traced", "local-True")
    check(not os.path.exists(os.path.join(root, "traced", "local-False", "steps.rank0.jsonl")),
          "an untraced run wrote a step trace")
    numel = [p.numel() for p in BnNet().parameters()]
    averaging = (4, 7)  # steps 5 and 8, numbered from 0
    for rank in range(2):
        lines = open(os.path.join(folder, "steps.rank%d.jsonl" % rank)).read().splitlines()
        header, steps = json.loads(lines[0]), [json.loads(line) for line in lines[1:]]
        check(header["source"] == "pytorch" and [t["elements"] for t in header["tensors"]] == numel,
              "header %s" % lines[0][:300])
        check([st["step"] for st in steps] == list(range(9)), "steps %s" % [st["step"] for st in steps])
        buckets = len([c for c in steps[1]["compute"] if c["kind"] == "backward"])  # after DDP's rebuild in step 0
        check(buckets >= 2, "the model should have several buckets, DDP made %d" % buckets)
        for st in steps:
            s = st["step"]
            bwd = [c for c in st["compute"] if c["kind"] == "backward"]
            ready = sorted(t for c in bwd for t in c["ready"])
            check(len(bwd) == (1 if s == 0 else buckets), "step %d: %d backward segments, %d buckets"
                  % (s, len(bwd), buckets))
            check(sorted(u["tensor"] for u in st["updates"]) == list(range(len(numel))), "step %d: updates" % s)
            check(sum(u["dur_s"] for u in st["updates"]) < 0.03, "step %d: the optimizer took %.4f s" % (
                s, sum(u["dur_s"] for u in st["updates"])))
            groups = st["groups"]
            if s < 2:  # DDP's buckets through the state's compressor
                check(ready == list(range(len(numel))) and len(groups) == len(bwd),
                      "gradient step %d: ready %s, %d groups" % (s, ready, len(groups)))
                continue
            check(ready == [], "local step %d: backward made %s ready for a group" % (s, ready))
            if s not in averaging:
                check(groups == [], "local step %d ran %d groups" % (s, len(groups)))
                continue
            check(len(groups) == 3, "averaging step %d: %d groups" % (s, len(groups)))
            finite, deltas, stats = groups
            coll = [p for p in finite["phases"] if p["kind"] == "collective"]
            check(finite["chunks"] == [] and len(coll) == 1 and coll[0]["op"] == "allgatherv"
                  and coll[0]["rank_bytes"] == [24, 24], "the finiteness check's group %s" % finite)
            check(sorted(t for t, _ in deltas["chunks"]) == list(range(len(numel))), "the deltas' group carries %s"
                  % deltas["chunks"])
            ops = [p["op"] for p in deltas["phases"] if p["kind"] == "collective"]
            check(deltas["phases"][0]["kind"] == "compress" and ops and set(ops) <= {"allgatherv", "allgather_sizes"},
                  "the deltas' phases %s" % deltas["phases"])
            coll = [p for p in stats["phases"] if p["kind"] == "collective"]
            check(stats["chunks"] == [] and len(coll) == 1 and coll[0]["op"] == "allreduce"
                  and coll[0]["bytes"] == 48 * 4 and coll[0]["dtype"] == "f32", "the statistics' group %s" % stats)
            end = max(c["start_s"] + c["dur_s"] for c in bwd)
            check(finite["issue_s"] >= end - 1e-6 and deltas["issue_s"] >= finite["issue_s"]
                  and stats["issue_s"] >= deltas["issue_s"],
                  "step %d: the averaging was issued before backward ended" % s)
            spans = sum(p["dur_s"] for g in groups for p in g["phases"])
            optimizer = sum(u["dur_s"] for u in st["updates"])
            check(end + optimizer + spans <= st["step_s"] + 1e-4,
                  "step %d: backward ends at %.4f, the optimizer takes %.4f and the groups %.4f, past the step's %.4f"
                  % (s, end, optimizer, spans, st["step_s"]))
    # What each rank's steps did on its own, by the trace: computation, the optimizer, the groups' codec phases (the
    # collectives are priced anew by the replay).
    own = []
    for rank in range(2):
        own.append([sum(c["dur_s"] for c in st["compute"]) + sum(u["dur_s"] for u in st["updates"])
                    + sum(p["dur_s"] for g in st["groups"] for p in g["phases"] if p["kind"] != "collective")
                    for st in map(json.loads, open(os.path.join(folder, "steps.rank%d.jsonl" % rank))
                                  .read().splitlines()[1:])])

    def whatif(*extra):
        out = subprocess.run([terse_bin, "whatif", folder, "--json", "-"] + list(extra), check=True,
                             capture_output=True, text=True).stdout
        return json.loads(out[out.index("\n{") + 1:])["step_s"]

    # As it ran, on a network that costs nothing: from the first local step on, a rank's steps run one after the
    # other (a local step's optimizer after its computation, an averaging's groups after that), the ranks apart
    # between averagings. So the replayed time of steps 3-9 is at least each rank's own (less a tenth for the ranks'
    # skew when they leave the gradient steps) and about the slower rank's, step by step: more where an averaging's
    # collectives wait for one rank's compress and then the other's decompress and optimizer (a fifth, and 1 ms for
    # the collectives). An optimizer dropped or counted twice moves it by more than half.
    same = whatif("--workers", "2", "--bandwidth", "100Gbps", "--latency", "1us")
    total = sum(same[2:])
    low = max(sum(o[2:]) for o in own)
    high = 1.2 * sum(max(o[s] for o in own) for s in range(2, 9)) + 1e-3
    check(0.9 * low <= total <= high, "steps 3-9 replayed in %.4f s; each rank's own %.4f and %.4f, the slower's "
          "step by step %.4f" % (total, sum(own[0][2:]), sum(own[1][2:]), high))
    # At 256 workers on a slow link the averagings grow, the local steps do not.
    slow = whatif("--workers", "256", "--bandwidth", "100Mbps", "--latency", "50us")
    for s in range(2, 9):
        if s in averaging:
            check(slow[s] > same[s] + 5e-3, "averaging step %d: %.4f s at 256 workers, %.4f at 2"
                  % (s, slow[s], same[s]))
        else:
            check(abs(slow[s] - same[s]) < 1e-9, "local step %d: %.4f s at 256 workers, %.4f at 2"
                  % (s, slow[s], same[s]))
    # The drifting replicas: the replay at their world on a free network takes about the run's wall time, less the
    # gloo collectives' own time (priced at nearly nothing here, a few ms on a busy host). Rank 0's wait for rank 1 is
    # a collective's, which the replay times anew, not its optimizer's: counted as optimizer time, it replayed a fifth
    # over the wall time.
    skewed = os.path.join(root, "traced", "skewed")
    out = subprocess.run([terse_bin, "whatif", skewed, "--workers", "2", "--bandwidth", "100Gbps", "--latency", "1us",
                          "--json", "-"], check=True, capture_output=True, text=True).stdout
    replayed = sum(json.loads(out[out.index("\n{") + 1:])["step_s"])
    wall = float(open(os.path.join(root, "wall")).read())
    check(0.75 * wall <= replayed <= 1.1 * wall, "drifting replicas: the run took %.4f s, replayed %.4f s"
          % (wall, replayed))
    print("trace: %d buckets; local steps %.2f ms, averaging steps %.2f ms as run, %.2f ms at 256 workers; drifting "
          "replicas ran %.1f ms, replayed %.1f" % (buckets, 1e3 * same[2], 1e3 * same[4], 1e3 * slow[4], 1e3 * wall,
                                                   1e3 * replayed))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["exact", "logger", "refusals", "buffers", "failures", "trace"])
    p.add_argument("--terse", help="the terse binary (case trace: terse whatif)")
    args = p.parse_args()
    if args.case == "exact":
        spawn(exact, world=2)
        spawn(exact, world=3)
    elif args.case == "logger":
        with tempfile.TemporaryDirectory() as tmp:
            spawn(logger, tmp)
            check_logger(tmp)
    elif args.case == "buffers":
        spawn(buffers)
    elif args.case == "failures":
        spawn(failures)
    elif args.case == "trace":
        with tempfile.TemporaryDirectory() as tmp:
            spawn(trace, tmp)
            check_trace(tmp, args.terse)
    else:
        # terse.local_sgd imported before terse.torch (pydoc, autodoc and pytest import it alone).
        subprocess.run([sys.executable, "-c", "import terse.local_sgd; import terse.torch; "
                        "assert terse.torch.LocalSGD is terse.local_sgd.LocalSGD"], check=True)
        spawn(refusals, timeout_s=60)
    print("%s: ok" % args.case)


if __name__ == "__main__":
    sys.exit(main())
