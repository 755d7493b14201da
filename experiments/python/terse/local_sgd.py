"""Local SGD for PyTorch through terse's compressors: the replicas step on their own and average every few steps.

    state = terse.torch.CompressionState("topk", ratio=0.01, error_feedback=True, module=model)
    local = terse.torch.LocalSGD(state, ddp, period=16)                # collective: every rank builds it alike
    ddp.register_comm_hook(local, terse.torch.local_sgd_hook)          # optional (see below)
    for x, y in batches:
        opt.zero_grad()
        loss_fn(ddp(x), y).backward()
        opt.step()
        local.step(average=last)   # averages every `period` steps (or qsr_alpha's rounds); before a scheduler's step()

This is the schedule of terse's native local SGD (core/train/sync_trainer.h, "Local SGD"; docs/local-sgd.md), for a
PyTorch model: local SGD and post-local SGD (Stich 2019; Lin et al., ICLR 2020 -- torch's PostLocalSGDOptimizer with
PeriodicModelAverager), DiLoCo's and SlowMo's outer step, and compressed averaging (Qsparse-local-SGD, Basu et al.
2019), which torch's averagers do not have: what is averaged goes through the state's terse compressor.

  - Steps before `start_step` are DDP's gradient steps, through `state`'s compressor (local_sgd_hook hands those
    buckets to compression_hook). From start_step on, a step is local: local_sgd_hook hands DDP each bucket back as it
    is, so every replica applies its own gradient with its own optimizer state (momentum stays per rank).
  - local.step(), after each optimizer step, counts the step. When (steps - start_step) is a multiple of `period` (with
    qsr_alpha, at the end of a round of the quadratic synchronization rule: below), it averages: each parameter's
    delta = anchor - value (the anchor is the model every rank shared after the last averaging) goes through the
    state's aggregation (compressor, error feedback, the collectives its caps ask for, over its process group), and
    value = anchor - mean(delta) becomes the new anchor, bit for bit the same on every rank. With an outer optimizer,
    u = outer_momentum * u + mean(delta) (Nesterov: the step is mean(delta) + outer_momentum * u) and value = anchor -
    outer_lr * step: DiLoCo's outer SGD, SlowMo with a constant inner rate.
  - local.step(average=True) averages at a step off the grid too: terse's driver does so at its evaluation points,
    as the native runner does, so that every rank evaluates one model. The schedule's rounds stay as they are.
  - qsr_alpha > 0 (with optimizer=) makes the rounds the quadratic synchronization rule's (Gu, Lyu, Arora, Zhang,
    Huang, ICLR 2024): a round that begins after d steps lasts max(period, floor((qsr_alpha / lr)^2)) steps, lr the
    optimizer's rate at that moment (step d - 1's, or step 0's for a round that begins at 0), as the native trainer
    draws them (core/train/local_sgd_schedule.h); a rate that rises inside a round (a warm-up's, a restart's) cuts it
    to what that rate asks for. Every rank must see the same rate: the check before each averaging compares them.

Each parameter is its own tensor (its index in module.parameters(), as the hook numbers them), so PowerSGD factors
matrices and top-k keeps k per tensor; with the state's granularity="bucket" (or `none` summed in place) each dtype's
deltas are one tensor, as a bucket is. The averagings' payload and wire bytes are counted by the state, beside the
gradient steps'; the time an averaging takes is exposed (training waits for it). Given the DDP wrapper, LocalSGD turns
DDP's buffer broadcast off when the local steps begin (it would send rank 0's buffers at every forward, uncounted) and
averages the persistent floating-point buffers (BatchNorm's running statistics) at each averaging, in f32, uncompressed
and counted; non-persistent buffers are derived (a mask) and left alone. Each averaging first checks, with one small
collective, that every replica is finite: a replica that diverged alone fails every rank's step(), naming it, before a
compressor could refuse its NaN on that rank alone (leaving the others inside a collective) or spread it to every
replica.

Without local_sgd_hook, DDP allreduces every step's gradients in the local phase too; skip DDP there instead (its
no_sync(), or train the module itself). With start_step 0 no gradient is ever exchanged and DDP is not needed at all,
but then the replicas must start alike: the first anchor is compared across the ranks (and so is the anchor at
start_step), and ranks whose models differ raise InvalidArgument naming the step, rather than averaging models that
never were one.

Refused, with the native run's rules (experiments/configs/README.md, rule `local-sgd`): a compressor with CUSTOM
aggregation (signSGD's majority vote: the average must be the mean of the deltas), DGC momentum correction (its
momentum would run over the deltas), and with start_step > 0 error feedback or a stateful compressor, whose memory
of the gradient steps would be added to the deltas. Also refused: a SyncBatchNorm, buffers off the parameters' device.

Step traces: with a state built with step_trace=True, a local step is recorded as its computation (forward, backward
as DDP hands over each bucket, with no tensor made ready for a group) and its optimizer step; an averaging's groups
(the finiteness check's all-gather, the deltas', one per dtype, and the buffers' allreduce) are groups of the step
that averaged, issued after its optimizer step, so `terse whatif` replays the run at N workers: each averaging's
collectives priced at N once the step's computation ends (before its optimizer time: the same serial sum), the
workers meeting at the first, the local steps as recorded. The averaging's
host work beside its groups (the deltas, the outer step) is counted as that step's optimizer time; the check of the
replicas when the local steps begin is left out.
"""

import hashlib
import json
import math
import numbers
import time

import torch

from . import _terse
from .torch import (CompressionState, _all_gather_held, _described, _disagreeing, _invalid, _require,
                    _trace_local_bucket, compression_hook)

__all__ = ["LocalSGD", "local_sgd_hook"]

# Bucket indices of the averagings' buffers (one per dtype), apart from DDP's bucket indices (0, 1, ...), which key
# the state's per-bucket byte counts and, with granularity "bucket", its pipelines.
_BUCKET_BASE = 1 << 20


class _Group:
    """The parameters of one dtype: flat buffers for the anchor, the deltas and the outer momentum, and each
    parameter's view of them."""

    def __init__(self, params, ids, outer_momentum):
        first = params[0]
        total = sum(p.numel() for p in params)
        self.params = params
        self.dtype = first.dtype
        self.anchor = torch.empty(total, dtype=first.dtype, device=first.device)
        self.delta = torch.empty_like(self.anchor)
        self.momentum = torch.zeros_like(self.anchor) if outer_momentum > 0 else None
        self.members = []
        self.anchors, self.deltas, self.momenta = [], [], []
        at = 0
        for p, tid in zip(params, ids):
            n = p.numel()
            self.members.append((tid, at, tuple(p.shape)))
            self.anchors.append(self.anchor[at:at + n].view_as(p))
            self.deltas.append(self.delta[at:at + n].view_as(p))
            if self.momentum is not None:
                self.momenta.append(self.momentum[at:at + n].view_as(p))
            at += n


class LocalSGD:
    """Local SGD through a CompressionState (see the module's text).

    state           the terse.torch.CompressionState whose compressor averages the models (and, before start_step,
                    aggregates DDP's gradients through local_sgd_hook)
    module          the model (or its DDP wrapper): its parameters that require a gradient are averaged
    period          steps between two averagings (an int >= 1)
    start_step      gradient steps before the first local one (an int >= 0; 0: local from the first step)
    outer_lr        the outer step's rate, in (0, 100] (1 with no outer momentum: plain averaging)
    outer_momentum  the outer step's momentum, in [0, 1)
    outer_nesterov  Nesterov's form of the outer momentum (needs outer_momentum > 0)
    qsr_alpha       > 0: the quadratic synchronization rule (Gu et al., ICLR 2024): each round lasts
                    max(period, floor((qsr_alpha / lr)^2)) steps, lr the optimizer's rate when the round begins, so
                    the rounds lengthen as the rate decays (period is the paper's H_base); 0: every `period` steps
    optimizer       the torch optimizer (needed with qsr_alpha: its param_groups[0]["lr"] is read when each round
                    begins: call step() after optimizer.step() and before a learning-rate scheduler's step()); or
                    set local.optimizer later, before the first step

    Collective: every rank builds it at the same point, with the same settings (compared across the ranks, as the
    state compares its own: a rank that differs raises InvalidArgument naming the settings on every rank).
    """

    def __init__(self, state, module, *, period, start_step=0, outer_lr=1.0, outer_momentum=0.0,
                 outer_nesterov=False, qsr_alpha=0.0, optimizer=None):
        # Without a state there is no process group to agree over: these two raise at once.
        _require(isinstance(state, CompressionState),
                 "LocalSGD: state must be a terse.torch.CompressionState, got %s" % _described(state))
        _require(isinstance(module, torch.nn.Module),
                 "LocalSGD: 'module' must be a torch.nn.Module (the model or its DDP wrapper), got %s"
                 % _described(module))
        # Every other refusal is collected and settled across the ranks (_compare) before any is raised: a rank that
        # refused alone would leave its peers in the settings' all_gather.
        refusals = []

        def need(cond, message):
            if not cond and not refusals:
                refusals.append("LocalSGD: " + message)

        for key, value, least in (("period", period, 1), ("start_step", start_step, 0)):
            need(isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= least,
                 "'%s' must be an integer >= %d, got %r" % (key, least, value))
        need(isinstance(outer_lr, numbers.Real) and not isinstance(outer_lr, bool) and math.isfinite(outer_lr)
             and 0 < outer_lr <= 100, "'outer_lr' must be finite and in (0, 100], got %r" % (outer_lr,))
        need(isinstance(outer_momentum, numbers.Real) and not isinstance(outer_momentum, bool)
             and 0 <= outer_momentum < 1, "'outer_momentum' must be in [0, 1), got %r" % (outer_momentum,))
        need(isinstance(outer_nesterov, bool), "'outer_nesterov' must be True or False, got %r" % (outer_nesterov,))
        need(not outer_nesterov or (isinstance(outer_momentum, numbers.Real) and outer_momentum > 0),
             "outer_nesterov=True needs outer_momentum > 0 (Nesterov's form of a momentum)")
        need(isinstance(qsr_alpha, numbers.Real) and not isinstance(qsr_alpha, bool) and math.isfinite(qsr_alpha)
             and qsr_alpha >= 0, "'qsr_alpha' must be finite and >= 0, got %r" % (qsr_alpha,))
        need(optimizer is None or isinstance(optimizer, torch.optim.Optimizer),
             "'optimizer' must be a torch.optim.Optimizer, got %s" % _described(optimizer))
        caps = state.caps
        name = state.plugin["name"]
        need(caps["aggregation"] != "custom",
             "compressor '%s' aggregates with its own reduce (CUSTOM: a majority vote or the like), and an averaging "
             "needs the mean of the deltas; choose a SUM or ALLGATHER compressor" % name)
        need(state._settings["momentum_correction"] == 0,
             "the state's momentum_correction %s would run DGC's momentum over the averagings' deltas; use "
             "outer_momentum=, or error_feedback alone" % state._settings["momentum_correction"])
        need(not (state._settings["error_feedback"] and state._settings["error_feedback_rule"] == "ef21"),
             "the state's error_feedback_rule 'ef21' keeps estimates of each rank's gradient, and the averagings "
             "compress parameter deltas; use error_feedback_rule='ef' (Qsparse-local-SGD)")
        need(state._settings["compression_start_step"] == 0,
             "the state's compression_start_step %d is a dense warm-up of gradient steps; LocalSGD's start_step= is "
             "its gradient phase: pass start_step= and a state with compression_start_step=0"
             % state._settings["compression_start_step"])
        if isinstance(start_step, numbers.Integral) and start_step > 0:
            need(not state._settings["error_feedback"],
                 "error feedback with start_step %d: the residual of the gradient steps would be added to the "
                 "parameter deltas the local phase averages; use start_step=0 (Qsparse-local-SGD) or a state without "
                 "error_feedback" % start_step)
            need(not caps["stateful"],
                 "compressor '%s' keeps state between calls, which would carry from the gradient steps into the "
                 "averagings' deltas with start_step %d; use start_step=0, or a stateless compressor"
                 % (name, start_step))
        need(state._logged is None,
             "a ResultsLogger already logs this CompressionState as a synchronous run; build the LocalSGD first and "
             "give the logger the LocalSGD (state=local)")
        ddp = module if isinstance(module, torch.nn.parallel.DistributedDataParallel) else None
        model = module.module if ddp is not None else module
        need(not any(isinstance(m, torch.nn.SyncBatchNorm) for m in model.modules()),
             "the module has a SyncBatchNorm, which all-gathers its batch statistics in every forward, the local "
             "steps' too; convert it to BatchNorm (local SGD averages the running statistics at each averaging)")
        # What DDP leaves alone (DistributedDataParallel._set_params_and_buffers_to_ignore_for_model: rank-local by
        # design), the averagings leave alone too.
        ignored = set(getattr(model, "_ddp_params_and_buffers_to_ignore", ()))
        params = [p for pname, p in model.named_parameters() if p.requires_grad and pname not in ignored]
        need(params, "the module has no parameter that requires a gradient")
        devices = sorted({str(p.device) for p in params})
        need(len(devices) <= 1, "the module's parameters lie on several devices (%s); a state averages the parameters "
             "of one device" % ", ".join(devices))
        # The persistent floating-point buffers (BatchNorm's running statistics): DDP broadcasts rank 0's at every
        # forward, which the local steps must not do (uncounted traffic, and rank 0's statistics for every replica),
        # so the local phase turns that off (given the DDP wrapper) and averages them at each averaging instead, in
        # f32, counted beside the deltas. Non-persistent buffers are derived (an attention mask) and alike on every
        # rank; integer ones (a step count) advance alike on every rank.
        persistent = {}
        for prefix, mod in model.named_modules():
            for bname, b in mod._buffers.items():
                if b is not None and bname not in mod._non_persistent_buffers_set:
                    persistent[id(b)] = (prefix + "." if prefix else "") + bname
        self._buffers = [b for bname, b in model.named_buffers()
                         if id(b) in persistent and bname not in ignored and b.is_floating_point()]
        need(all(str(b.device) in devices for b in self._buffers),
             "the module's buffers lie on %s, its parameters on %s; a state averages the tensors of one device"
             % (", ".join(sorted({str(b.device) for b in self._buffers})), ", ".join(devices)))
        self.compression = state
        self.error = None       # terse's exception of the first averaging or check that failed: every later step raises
        self._ddp = ddp
        self.steps = 0          # optimizer steps counted by step()
        self.averagings = 0     # averagings done
        self._last_average = 0  # the step count of the last averaging
        self._has_anchor = False
        self._traced = state._tracer._step if state._tracer is not None else 0  # traced backwards at the last step()
        self._groups = []
        device = params[0].device if params else torch.device("cpu")
        settings = {"period": period, "start_step": start_step, "outer_lr": outer_lr,
                    "outer_momentum": outer_momentum, "outer_nesterov": outer_nesterov, "qsr_alpha": qsr_alpha,
                    "parameters": "%d tensors, %d elements, sha256 of their dtypes and shapes %s" % (
                        len(params), sum(p.numel() for p in params), hashlib.sha256(json.dumps(
                            [[str(p.dtype), list(p.shape)] for p in params]).encode()).hexdigest()[:12]),
                    "buffers": "%d floating buffers, %d elements" % (len(self._buffers),
                                                                     sum(b.numel() for b in self._buffers)),
                    "refused": refusals[0] if refusals else None}
        self._compare("the ranks' LocalSGD settings differ", settings,
                      "every rank must build its LocalSGD alike, since the averagings are collectives", device)
        if refusals:
            raise _invalid(refusals[0])  # on every rank alike: _compare found them equal
        self.period = int(period)
        self.start_step = int(start_step)
        self.outer_lr = float(outer_lr)
        self.outer_momentum = float(outer_momentum)
        self.outer_nesterov = outer_nesterov
        self.qsr_alpha = float(qsr_alpha)
        self.optimizer = optimizer  # with qsr_alpha, whose rate each round reads (settable until the first step)
        self._next = None  # the step count where the round under way ends (averages on schedule); None: not drawn yet
        self._round_start = 0  # the step count where the round under way began (the rule's)
        self._buffer_flat = (torch.empty(sum(b.numel() for b in self._buffers), dtype=torch.float32, device=device)
                             if self._buffers else None)
        # One buffer per dtype, in the order of the dtypes' first parameters; the tensor ids are the hook's.
        by_dtype = {}
        for p in params:
            by_dtype.setdefault(p.dtype, []).append(p)
        self._groups = [_Group(ps, [state._tensor_id(p) for p in ps], self.outer_momentum)
                        for ps in by_dtype.values()]
        state._local_sgd = self
        if self.start_step == 0:
            self._take_anchor()

    @property
    def parameters(self):
        """The parameters the averagings average (those that require a gradient, less DDP's ignored ones)."""
        return [p for g in self._groups for p in g.params]

    @property
    def local(self):
        """Whether the next step is a local one (no gradient exchange)."""
        return self.steps >= self.start_step

    def step(self, average=False):
        """Counts an optimizer step (call it right after optimizer.step()) and averages when the schedule says so, or,
        with average=True, at this step anyway (a local step only: a gradient step's replicas already agree).
        Collective from start_step on. Returns whether it averaged. Once an averaging or a check failed, every call
        raises that error again (the replicas are no longer one model)."""
        if self.error is not None:
            raise type(self.error)("LocalSGD: an earlier averaging failed, local SGD is stopped: %s" % (self.error,))
        try:
            tracer = self.compression._tracer
            if tracer is not None:
                # A traced step begins where DDP hands over its first bucket through the hook: a backward that did not
                # reach the tracer would leave this step's averaging in an earlier step's record.
                if tracer._step == self._traced:
                    raise _invalid("LocalSGD: the state records a step trace, and step %d's backward did not reach it; "
                                   "register the hook (ddp.register_comm_hook(local, terse.torch.local_sgd_hook)) "
                                   "and call step() once per backward" % (self.steps + 1))
                self._traced = tracer._step
            if self.qsr_alpha > 0 and self.optimizer is None:
                raise self._no_optimizer()
            if not self._has_anchor and self.steps + 1 == self.start_step:
                self.steps += 1
                self._take_anchor()  # the model the gradient steps left every rank with
                self._next = self.steps + self._round()
                return False
            was_local = self.local
            self.steps += 1
            if not was_local:
                return False
            if self._next is None:  # start_step 0: the first round, at step 0's rate
                self._next = self.start_step + self._round()
                self._round_start = self.start_step
            elif self.qsr_alpha > 0:
                # A rate that rose inside the round (a warm-up's, a scheduler's restart) cuts the round to what it asks
                # for, counted from the round's start (core/train/local_sgd_schedule.h, scheduledAveragings).
                shorter = self._round_start + _terse.local_round_length(self.period, self.qsr_alpha, self._rate())
                if shorter < self._next:
                    self._next = max(shorter, self.steps)
            if self.steps == self._next:
                self._average()
                self._next = self.steps + self._round()
                return True
            if average:
                self._average()  # off the schedule, whose rounds stay as they are
                return True
            return False
        except Exception as e:
            self.error = e
            raise

    # ---- the averaging

    def _round(self):
        """The length of the round beginning now: `period`, or with qsr_alpha the quadratic synchronization rule's,
        at the optimizer's current rate (the step just taken's, when step() is called before a scheduler's step())."""
        if self.qsr_alpha <= 0:
            return self.period
        if self.optimizer is None:
            raise self._no_optimizer()
        self._round_start = self.steps
        return _terse.local_round_length(self.period, self.qsr_alpha, self._rate())

    def _rate(self):
        """The optimizer's learning rate now (its first parameter group's): the rule's input."""
        return float(self.optimizer.param_groups[0]["lr"])

    def _no_optimizer(self):
        return _invalid("LocalSGD: qsr_alpha=%r reads the optimizer's learning rate when each round begins; give "
                        "LocalSGD(..., optimizer=opt), or set local.optimizer = opt before the first step"
                        % self.qsr_alpha)

    def _dist(self):
        group = self.compression.process_group
        if not torch.distributed.is_initialized():
            return None, 1
        return group, torch.distributed.get_world_size(group)

    def _compare(self, what, mine, remedy, device):
        """Every rank's `mine` (a dict of settings, or a str) is the same, or every rank raises InvalidArgument naming
        each rank's (for a dict, the keys that differ). `device`: the model's (NCCL gathers there)."""
        group, world = self._dist()
        if world == 1:
            return
        if torch.distributed.get_backend(group) != "nccl":
            device = torch.device("cpu")
        settings = mine if isinstance(mine, dict) else {"": mine}
        found = _disagreeing(settings, world, lambda t: _all_gather_held(t.to(device), world, group))
        if found is None:
            return
        every, differ = found
        texts = [", ".join("%s=%s" % (k, json.dumps(d.get(k))) for k in differ) if isinstance(mine, dict)
                 else str(d.get("")) for d in every]
        raise _invalid("LocalSGD: %s: %s; %s" % (what, "; ".join("rank %d: %s" % (r, t) for r, t in enumerate(texts)),
                                                   remedy))

    def _take_anchor(self):
        with torch.no_grad():
            for g in self._groups:
                for a, p in zip(g.anchors, g.params):
                    a.copy_(p)
        self._has_anchor = True
        # Local steps from models that differ would average models that never were one; DDP broadcasts rank 0's at
        # construction, but a module trained without DDP starts where each rank's seed put it.
        # One host copy of the model, once or twice a run (numpy's view of it is hashed in place).
        h = hashlib.sha256()
        for g in self._groups:
            h.update(g.anchor.detach().cpu().view(torch.uint8).numpy())
        with self.compression._aside():  # a check once a run, not a training step's work
            self._compare("the replicas differ when local SGD starts (after %d steps)" % self.steps,
                          h.hexdigest()[:16], "build every rank's model from one seed, or wrap it in "
                          "DistributedDataParallel, which broadcasts rank 0's parameters",
                          self._groups[0].anchor.device)
        if self._ddp is not None:
            self._ddp.broadcast_buffers = False  # the local steps send nothing; _average_buffers keeps them one

    def _check_finite(self):
        """Every rank averages at this step, from the same learning rate under the quadratic synchronization rule, and
        its deltas and averaged buffers are finite; or every rank raises, naming what differs or the ranks whose
        values are not finite. A replica that diverged alone would otherwise fail in its compressor's encode (top-k,
        QSGD refuse a non-finite input) and leave its peers inside the collective, or (fp16, none) spread its NaN to
        every replica; ranks whose rates differ would draw different rounds and pair one rank's averaging with
        another's later one. One small collective (three doubles a rank)."""
        bad = int(any(not bool(torch.isfinite(g.delta).all()) for g in self._groups)
                  or (self._buffer_flat is not None and not bool(torch.isfinite(self._buffer_flat).all())))
        rate = self._rate() if self.qsr_alpha > 0 and self.optimizer is not None else 0.0
        group, world = self._dist()
        if world > 1:
            device = self._groups[0].delta.device
            if torch.distributed.get_backend(group) != "nccl":
                device = torch.device("cpu")
            state = self.compression
            start = _terse.monotonic()
            mine = torch.tensor([bad, self.steps, rate], dtype=torch.float64, device=device)
            every = [t.tolist() for t in _all_gather_held(mine, world, group)]
            if state._tracer is not None:
                # Where replicas that drifted apart between averagings meet: a group of its own in the step trace, so
                # that a replay has its workers wait for each other here rather than in the optimizer's time.
                end = _terse.monotonic()
                state._agg.trace_gather(24, start, end)
                state._tracer.aside(end - start)
        else:
            every = [[bad, self.steps, rate]]
        if any(e[1:] != every[0][1:] for e in every):
            raise _invalid("LocalSGD: the ranks average at different points: %s; every rank must count the same steps "
                           "and, under the quadratic synchronization rule, see the same learning rate (its rounds "
                           "follow it), or the averagings pair up wrongly"
                           % "; ".join("rank %d after step %d%s" % (r, int(e[1]), ", lr %r" % e[2] if self.qsr_alpha
                                                                     > 0 else "") for r, e in enumerate(every)))
        ranks = [r for r, e in enumerate(every) if e[0]]
        if ranks:
            raise _invalid("LocalSGD: the model of rank%s %s holds a non-finite value (in its parameters or its "
                           "buffers) after step %d, %d steps after the last averaging; nothing was averaged. Lower the "
                           "learning rate or the period"
                           % ("s" if len(ranks) > 1 else "", ", ".join(map(str, ranks)), self.steps,
                              self.steps - max(self.start_step, self._last_average)))

    def _average(self):
        state = self.compression
        start = time.perf_counter()
        with torch.no_grad():
            for g in self._groups:
                for d, a, p in zip(g.deltas, g.anchors, g.params):
                    torch.sub(a, p, out=d)
            at = 0
            for b in self._buffers:  # cast to f32 where the buffer is another floating type
                self._buffer_flat[at:at + b.numel()].copy_(b.reshape(-1))
                at += b.numel()
            self._check_finite()
            for i, g in enumerate(self._groups):
                state._aggregate_owned(_BUCKET_BASE + i, g.delta, g.members, i == len(self._groups) - 1)
                if g.momentum is None and self.outer_lr == 1:
                    g.anchor.sub_(g.delta)
                else:
                    step = g.delta
                    if g.momentum is not None:
                        g.momentum.mul_(self.outer_momentum).add_(g.delta)
                        step = g.delta.add(g.momentum, alpha=self.outer_momentum) if self.outer_nesterov \
                            else g.momentum
                    g.anchor.sub_(step, alpha=self.outer_lr)
                for a, p in zip(g.anchors, g.params):
                    p.copy_(a)
            if self._buffer_flat is not None:
                state._average_dense(_BUCKET_BASE + len(self._groups), self._buffer_flat)
                at = 0
                for b in self._buffers:
                    b.copy_(self._buffer_flat[at:at + b.numel()].view_as(b))
                    at += b.numel()
        self.averagings += 1
        self._last_average = self.steps
        state._agg.add_exposed(time.perf_counter() - start)


def config_keywords(experiment):
    """LocalSGD's keywords from a terse experiment as terse.Recipe.experiment gives it (its `local_sgd` block, the
    schema's defaults for what is unset), or None where local SGD is off (no block, or period 0)."""
    block = experiment.get("local_sgd", {})
    if int(block.get("period", 0)) <= 0:
        return None
    return {"period": int(block["period"]), "start_step": int(block.get("start_step", 0)),
            "outer_lr": float(block.get("outer_lr", 1.0)), "outer_momentum": float(block.get("outer_momentum", 0.0)),
            "outer_nesterov": bool(block.get("outer_nesterov", False)),
            "qsr_alpha": float(block.get("qsr_alpha", 0.0))}


def register(ddp, state, keywords):
    """Registers on `ddp` (a DistributedDataParallel) the hook an experiment asks for: with LocalSGD `keywords`
    (config_keywords), local_sgd_hook over a LocalSGD built on `state` and `ddp`, returned (with qsr_alpha, set its
    `optimizer` before the first step); without (None), compression_hook over `state`, and returns None."""
    if keywords is None:
        ddp.register_comm_hook(state, compression_hook)
        return None
    local = LocalSGD(state, ddp, **keywords)
    ddp.register_comm_hook(local, local_sgd_hook)
    return local


def local_sgd_hook(state, bucket):
    """DDP communication hook of terse.torch.LocalSGD: a gradient step's bucket (before start_step) goes through the
    LocalSGD's CompressionState as compression_hook aggregates it; a local step's comes back as it is. Register it as
    ddp_model.register_comm_hook(local, terse.torch.local_sgd_hook)."""
    if not state.local:
        return compression_hook(state.compression, bucket)
    _trace_local_bucket(state.compression, bucket)
    buf = bucket.buffer()
    if buf.is_cuda:
        fut = torch.futures.Future(devices=[buf.device])
    else:
        fut = torch.futures.Future()
    fut.set_result(buf)
    return fut

