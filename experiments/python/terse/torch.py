"""terse compressors as a PyTorch DistributedDataParallel communication hook.

    state = terse.torch.CompressionState("topk", ratio=0.01, error_feedback=True, module=model)
    ddp_model.register_comm_hook(state, terse.torch.compression_hook)

    logger = terse.torch.ResultsLogger("results", study="mine", state=state)   # optional: a terse results folder
    ...
    logger.record(test_accuracy=acc, test_loss=loss)   # an evaluation point, collective: on every rank
    logger.finish()                                     # marks the results folder completed

This reads like torch's own hooks (`PowerSGDState(...)` + `powerSGD_hook`): a state object built with typed keyword
arguments, and one module-level hook function. The compressor's own parameters are keyword arguments too, by the names
`terse plugins show NAME` lists (`ratio=0.01`, `rank=4`, `levels=256`, `unbiased=True`); `params={...}` takes the same
as a dict, for a name that is also one of the state's keywords.

What runs per bucket is terse's, not a copy of it (experiments/python/ddp_aggregator.h): the plugin is found and
validated by terse's loader, each tensor's codec chain is built by terse's make_codec (error feedback and DGC momentum
correction are terse's decorators), and terse's aggregation engine runs the collective the plugin's caps ask for --
SUM: one allreduce of the summable payload; ALLGATHER: an all-gather of sizes, then of the payloads; CUSTOM: an
all-gather and the plugin's reduce fold; every round of a multi-round plugin such as PowerSGD, one after the other --
over the DDP process group through torch.distributed (experiments/python/torch_communicator.h).

Overlap (`overlap=True`, the default). The hook returns with a torch.futures.Future that completes when the bucket's
aggregation is done; DDP waits for every Future before backward returns. Two ways, by what the compressor is:
  chained     a one-round SUM compressor (none, fp16, bf16, randomk) on CPU gradients, without a step trace, and with
              `overlap="chain"` every SUM compressor, PowerSGD's two rounds among them: the hook encodes the bucket's
              first round (without the GIL) and returns a Future; the rounds' sums go out on torch.distributed's
              asynchronous all_reduce (async_op=True), and a callback on each round's collectives encodes the next
              round or decodes into the bucket and completes the Future, as DDP's own hooks chain theirs (engine.h,
              SplitSum). The collectives overlap the rest of backward; no thread of terse's is involved, which on the
              0.24M-parameter MLP of experiments/pytorch/bench_ddp_hooks.py took `none` from 1.30-1.37x DDP's step to
              1.16-1.18x (docs/pytorch.md). A one-round compressor's collectives are issued in the hook calls, in
              DDP's bucket order, with one then() callback per bucket (_OneRound), the shape of DDP's allreduce_hook.
              With `none` (TERSE_CAP_IDENTITY) the collective runs on DDP's bucket itself and no plugin is called
              (ddp_aggregator.h, "In place"): 1.01-1.05x DDP's step on that MLP, 1.00-1.02x on the 4M-parameter CNN.
              Several rounds: every rank issues the rounds in one order fixed by the bucket order alone
              (_Sequencer: round r of the b-th bucket after the first round of bucket b + r), never as they become
              ready, since gloo pairs collectives by the order they are issued in -- how DDP's own PowerSGD hook,
              which issues its second round when the first completes, aborts in gloo with several buckets. A later
              round's encode runs on gloo's thread, which on the CPU holds up the group's other collectives: PowerSGD
              chained took 4-12% more per step than on the worker, so overlap=True leaves it there (_chains).
              On CUDA gradients a one-round SUM compressor chains with `overlap="chain"`: the encode and the collective
              are queued on the bound stream in the hook call, NCCL runs the callback at once on the same thread, and
              the decode is queued behind the collective; the bucket's Future is a CUDA-aware one completed on the bound
              stream (a side stream of the state's, by default: the `stream` keyword). The payload checks' verdicts,
              which would otherwise be read once a bucket, blocking that thread until the collective is done, stay on
              the device until the step's last bucket and are read there, once a step (ddp_aggregator.h). overlap=True
              keeps the worker on CUDA until the chain is measured against it on a GPU
              (results/reference/gpu/README.md). PowerSGD chains there too with "chain" (_Sequencer, on the bound
              stream), since its second round's check of its input, the summed P, stays on the device
              (terse_compressor_compress_deferred_v1); a multi-round plugin without that entry point stays on the
              worker, as do the compressors that cannot be chained at all.
  thread      every other compressor (ALLGATHER and CUSTOM: top-k, qsgd, 1-bit, ...; with overlap=True, PowerSGD), CUDA
              gradients unless chained, a step trace, or
              `overlap="thread"`: one worker thread per state aggregates the buckets in the order DDP hands them over
              (the same order on every rank, so the collectives match across ranks) and completes each bucket's Future
              when its aggregation is done. The encode, decode and the waits inside torch.distributed run without the
              GIL, so they overlap the rest of backward, which autograd runs in C++.
`overlap=False` aggregates inside the hook and returns a completed Future. All three give the same bits
(tests/python/ddp_hook_test.py checks it); without overlap every microsecond is exposed.

Once a bucket fails, the state is failed: the buckets queued behind it fail without a collective (so a rank that fails
alone does not pair its next bucket's collective with a peer's current one), and every later hook call raises the same
error. A chained bucket's first encode fails in the hook call itself, before its collective; a later round's fails its
Future. Chained, a refused hook call or a failed encode stops what is issued from its place in the order on, on every
rank alike, whenever each rank notices it (_Sequencer, _OneRound), so no rank is left inside a collective; a failed
decode stops nothing in its step. Call `state.close()` before the DDP wrapper goes away: it waits until torch has let
go of the chained callbacks, without which a process group destroyed with the GIL held can hang (close() says how). `state.error` holds terse's exception. Out of `loss.backward()` the error is terse's exception
itself where torch re-raises what the hook raised (torch 2.x, without overlap or when the hook call refuses), and
torch's RuntimeError naming terse's exception and keeping its text otherwise (torch 1.13; a Future's error in any
torch): `except RuntimeError` catches both (terse.Error is a RuntimeError). `state.raise_if_failed()` raises terse's
own.

Granularity (`granularity=`): "tensor" (the default) compresses each parameter of a bucket as its own tensor with its
shape, as terse's trainer does -- PowerSGD needs the matrices, top-k keeps k per tensor -- and fuses the bucket's
tensors into one collective per fusion class; "bucket" compresses the flat bucket as one vector. Tensor ids: with
`module=`, a parameter's index in module.parameters() (terse's own numbering for the same model, which keys the
random streams); without it, the order in which the hook first sees the parameters, which is the same on every rank.

Devices: CPU tensors over gloo, or the CUDA tensors of one device over NCCL (or gloo, which stages CUDA tensors through
the host itself: two ranks sharing one GPU). A state binds to its gradients' device -- at construction when `module=`
shows it, else at the first bucket -- and refuses a bucket on another device. On CUDA the plugin's device code runs on
torch's current stream of that device as the state first saw it (the bound stream): every codec buffer is device memory,
the payloads are wrapped as CUDA tensors for torch.distributed without a copy, and the decode writes the bucket in
place, so no gradient goes to the host (a variable-size payload under NCCL reads its n 8-byte sizes back). With
`stream="side"` the state binds a stream of its own instead, which waits on the device for each bucket's gradients as
DDP hands it over; a state that chains its buckets does so by default (stream=None), since on the current stream the
decode in a collective's callback would make every backward kernel queued after it wait for that collective, and so does
the worker's decode (with one GPU the collective is quick; with several it would hold backward up while the bucket is on
the network: not yet measured). On the side stream a synchronization of its stream (the engine's, once a bucket, to read
the payload checks' verdicts that the plugins leave on the device; signsgd's reduce, once a fold) then waits for the
hook's own work only, not for the backward kernels queued behind the bucket on torch's stream
(results/reference/gpu/README.md measured what the per-tensor synchronization cost on ResNet-50 with the current
stream). The overlap worker issues everything on the bound stream (torch.cuda.stream), so torch.distributed orders each
collective after the kernels that wrote its input; the bucket's Future is CUDA-aware (devices=[the device]), so DDP's
streams wait for the aggregation on the device, not on the host. A bucket written on another stream than the bound one
is waited for on the device (wait_stream) and recorded on the bound stream for torch's caching allocator. Refused before
any collective: a compressor without CUDA code (naming it), a build without CUDA, a process group whose backend cannot
carry CUDA tensors, an NCCL group for CPU gradients, a model across several devices, a device that is neither CPU nor
CUDA. Times on CUDA (encode_s, decode_s, comm_s, the step trace's phases) are the host's issue times of asynchronous
work, not the device's.

Failures: a missing plugin, a bad parameter, a plugin that fails, a bucket layout the hook cannot serve -- each raises
terse's exception with terse's message. Refusals happen before the bucket's first collective, so when they hit every
rank alike (the usual case: same plugin, same parameters, same model) no rank is left waiting in one. A failure on one
rank only leaves its peers in a gloo collective until this process's connections close (it exits or calls
torch.distributed.destroy_process_group()) or the group's timeout expires: gloo cannot be aborted from Python.

Step traces (`step_trace=True`, with `module=`): the state records what each training step did -- the forward of
every module that owns parameters, backward as DDP hands over each bucket, each bucket's compress, collectives and
decompress, and the time from the end of backward to the next forward (the script's optimizer step) -- in the format
`terse whatif` replays on a simulated cluster of N workers (experiments/python/hook_trace.h says what is recorded and
how). ResultsLogger.finish() writes every rank's steps.rank<R>.jsonl into the results folder; without a logger,
`state.write_step_trace(folder)` does. Forward hooks on the module's parameter-owning modules take the times; they
cost a few microseconds a module.

`ddp_hook()`, the factory of earlier versions that returned a (state, hook) pair and took string parameters, is
retired: CompressionState + compression_hook do its job, and ResultsLogger writes what its results_dir wrote.
"""

import atexit
import collections
import functools
import contextlib
import datetime
import difflib
import hashlib
import json
import math
import numbers
import os
import queue
import sys
import threading
import time
import weakref

import torch

from . import _terse
from ._plugins import search_path as _search_path

__all__ = ["CompressionState", "compression_hook", "ResultsLogger", "LocalSGD", "local_sgd_hook"]

# The states whose worker threads are alive, stopped at interpreter exit (see _stop_workers).
_live_states = weakref.WeakSet()

# Tensors made here and handed to a blocking torch.distributed call, kept until the process ends. Gloo's worker thread
# drops its reference to a work's tensors just after the caller's wait has returned; were that the last reference, the
# tensor's Python object would be freed there, which needs the GIL. If the process is leaving by then (a rank that
# raised right after the call, as a refused state does), the interpreter is finalizing and the thread is killed inside
# a noexcept frame: the process aborts with "terminate called without an active exception" (python.ddp_hook.errors
# did, once in about forty runs under load). Held here, gloo's reference is never the last. A few small tensors per
# state (torch_communicator.h does the same for the aggregator's own calls).
_held_past_gloo = []


def _keep_past_gloo(*tensors):
    _held_past_gloo.append(tensors)


def _all_gather_held(mine, world, group=None):
    """Every rank's `mine`, on the CPU, for a caller that may raise right after: the tensors are held past gloo's last
    reference (_held_past_gloo)."""
    every = [torch.empty_like(mine) for _ in range(world)]
    torch.distributed.all_gather(every, mine, group=group)
    got = [t.cpu() for t in every]
    _keep_past_gloo(mine, *every)
    return got


def _peer_settings(t, n, keys):
    """A rank's settings as _check_agreement gathers them (JSON, the first n bytes of t); a rank whose bytes do not read
    as such (another terse, or a broken peer) shows as unreadable, and the ranks still raise the mismatch."""
    try:
        settings = json.loads(bytes(t[:n].tolist()).decode()) if 0 <= n <= t.numel() else None
    except ValueError:
        settings = None
    if not isinstance(settings, dict):
        return {key: "(unreadable)" for key in keys}
    return settings


def _disagreeing(settings, world, gather):
    """Every rank's `settings` (a dict), or None when every rank's equal this rank's: one all_gather (`gather`, the
    caller's _all_gather_held on its group and stream) of a fingerprint and length a rank and, only when they differ,
    one of the settings as JSON padded to the longest rank's (not all_gather_object: its tensors are torch's, freed
    when it returns, and the caller raises right after -- see _held_past_gloo). Returns (every rank's settings, the keys
    whose values differ: this rank's keys in order, then any a peer of another terse has)."""
    text = json.dumps(settings, sort_keys=True, default=repr).encode()
    fingerprint = int.from_bytes(hashlib.sha256(text).digest()[:8], "little", signed=True)
    got = [t.tolist() for t in gather(torch.tensor([fingerprint, len(text)], dtype=torch.int64))]
    if all(f == fingerprint for f, _ in got):
        return None
    # Bounded: a peer's length is its own word (a few hundred bytes from this code).
    longest = max(min(max(n, 0), 1 << 16) for _, n in got)
    padded = torch.tensor(list(text) + [0] * (longest - len(text)), dtype=torch.uint8)
    every = [_peer_settings(t, n, settings) for t, (_, n) in zip(gather(padded), got)]
    keys = list(settings) + sorted({k for s in every for k in s} - set(settings))
    return every, [key for key in keys if any(s.get(key) != every[0].get(key) for s in every)]


def _invalid(message):
    return _terse.InvalidArgument("terse.torch: " + message)


def _plugin_value(key, value):
    """A typed keyword value as the plugin's parameter text (the form a config's `params` map holds)."""
    if isinstance(value, bool):  # before Integral: bool is an int
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        v = float(value)
        if not math.isfinite(v):
            raise _invalid("compressor parameter '%s' must be finite, got %r" % (key, value))
        return repr(v)  # the shortest text that reads back as the same double
    if isinstance(value, str):
        return value
    raise _invalid("compressor parameter '%s' must be a bool, int, float or str, got %s %r"
                   % (key, type(value).__name__, value))


def _require(cond, message):
    if not cond:
        raise _invalid(message)


def _real_dtype(dtype):
    """The dtype of a parameter's gradient in a DDP bucket: a complex parameter's is its real view's."""
    return {torch.complex64: torch.float32, torch.complex128: torch.float64}.get(dtype, dtype)


def _described(value):
    """A value in an error message: its type, and its repr unless that is long (a tensor's or a list's can be)."""
    text = repr(value)
    return "%s %s" % (type(value).__name__, text if len(text) <= 60 else text[:57] + "...")


# cudaStreamLegacy: the same stream as handle 0, torch's default stream; terse's ABI reserves a null stream for host
# tensors, so a CUDA state on torch's default stream is bound to this handle.
_CUDA_STREAM_LEGACY = 1


def _module_device(module):
    """The one device of the module's parameters, None for a module without any."""
    devices = sorted({str(p.device) for p in module.parameters()})
    if len(devices) > 1:
        raise _invalid("the module's parameters are on %s; a CompressionState aggregates the gradients of one "
                       "device (build one state per device)" % " and ".join(devices))
    return torch.device(devices[0]) if devices else None


# The groups _group_of_its_own made, by the id of the DDP group they stand beside: (that group, the group made, its
# timeout), one each, reused by every later state of that DDP group, as a group is never freed here (destroying one
# while a gloo thread holds a callback can hang: CompressionState.close). Every rank builds its states in one order, so
# every rank makes or reuses alike; a later state that asks for another timeout is refused rather than given a group of
# its own, which the ranks that did not ask would never join. The DDP group is held so that its id is not reused by a
# group made after it was destroyed (a script that calls init_process_group again).
_OWN_GROUPS = {}


def _options_timeout(pg):
    """The timeout in a process group's or backend's options, None where it has none to show.
    TORCH_DISTRIBUTED_DEBUG=DETAIL wraps one in a _ProcessGroupWrapper, whose wrapped_pg holds them."""
    for _ in range(4):  # a wrapper wraps a backend, not another wrapper; the bound only keeps a cycle out
        inner = getattr(pg, "wrapped_pg", None)
        if inner is None:
            break
        pg = inner
    timeout = getattr(getattr(pg, "options", None), "_timeout", None)
    return timeout if isinstance(timeout, datetime.timedelta) else None


def _timeout_of(group):
    """The timeout torch gave `group` (init_process_group's or new_group's timeout=), None where this torch does not
    show it. torch 1.13: the group is its backend (ProcessGroupGloo, ProcessGroupNCCL), whose `options._timeout` holds
    it. torch 2.x: a ProcessGroup with one backend per device type (`_get_backend`), each holding it in its own
    `options._timeout` (gloo's and NCCL's bindings; the 2.x path is read off torch's source, the tests run 1.13's).
    Other backends (mpi, ucc, a third party's) may show none."""
    timeout = _options_timeout(group)
    if timeout is not None or not hasattr(group, "_get_backend"):
        return timeout
    # One timeout for every backend of a group: new_group and init_process_group give each the same.
    for device in ("cpu", "cuda"):
        try:
            timeout = _options_timeout(group._get_backend(torch.device(device)))
        except RuntimeError:  # no backend for that device type
            continue
        if timeout is not None:
            return timeout
    return None


def _group_of_its_own(module, process_group, timeout):
    """The process group a state issues its collectives on. DDP with find_unused_parameters=True all-reduces its map of
    the parameters used in the step on its own process group as soon as the hook call of the step's last bucket
    returns. A state that issues collectives after its hook call returned -- the worker thread, a multi-round
    compressor's chained rounds -- would interleave them with that all_reduce in an order that may differ between
    ranks: a hang, or one rank's gradients summed with another's map. So a state beside such a DDP gets a group of its
    own, the same ranks and backend, made here by every rank of the world (every rank constructs its state); whatever
    its overlap, so that ranks that differ there still make the group alike and the first bucket's agreement check
    (_check_agreement) can say what differs. A DDP group that is not the whole world cannot be copied so (new_group
    needs every rank of the world): the caller must pass a group of terse's own.

    The group gets the timeout of the group it copies (`timeout`, when given, instead): new_group's default would
    quietly replace a short timeout the script set to catch hangs with torch's default (half an hour for gloo). Where
    torch does not show the DDP group's timeout, the caller must give it."""
    ddp_group = getattr(module, "process_group", None)
    world = torch.distributed.group.WORLD
    mine = process_group if process_group is not None else world
    if not getattr(module, "find_unused_parameters", False) or ddp_group is None or mine is not ddp_group:
        _require(timeout is None,
                 "'timeout' is the timeout of the process group a state makes of its own beside a DDP wrapper with "
                 "find_unused_parameters=True (module=), and this state makes none (%s): leave timeout= out and set "
                 "the timeout where the state's group is made (init_process_group or new_group)"
                 % ("process_group= is a group DDP does not use" if getattr(module, "find_unused_parameters", False)
                    and ddp_group is not None else "module= is not such a DDP wrapper"))
        return process_group
    _require(ddp_group is world,
             "module= is DDP with find_unused_parameters=True on a process group other than the default one: DDP "
             "all-reduces its map of used parameters on that group while terse's overlapped collectives may still go "
             "out, in another order on another rank. Pass process_group= a group of terse's own with the same ranks "
             "(torch.distributed.new_group, on every rank)")
    if timeout is None:
        timeout = _timeout_of(ddp_group)
        if timeout is None:
            try:
                backend = "backend '%s'" % torch.distributed.get_backend(ddp_group)
            except Exception:  # noqa: BLE001 -- only for the message
                backend = "its backend"
            raise _invalid("module= is DDP with find_unused_parameters=True, so the state makes a process group of its "
                           "own with the timeout of DDP's group, but torch %s does not show that group's timeout (%s):"
                           " pass timeout= (a datetime.timedelta) for the state's group"
                           % (torch.__version__, backend))
    made = _OWN_GROUPS.get(id(ddp_group))
    if made is None:
        made = _OWN_GROUPS[id(ddp_group)] = (ddp_group, torch.distributed.new_group(timeout=timeout), timeout)
    _require(made[2] == timeout,
             "the state would make its process group of its own with timeout %s, but this process already made that "
             "group beside DDP's with timeout %s, and every state beside one DDP group shares it (every rank must "
             "make or reuse it alike): give every such state the same timeout= (or none, for DDP's group's)"
             % (timeout, made[2]))
    return made[1]


# CompressionState's own keywords (every other keyword is the plugin's parameter): for a misspelt one's message.
_STATE_KEYWORDS = ("error_feedback", "error_feedback_rule", "ef21_momentum", "momentum_correction", "momentum_masking",
                   "momentum_nesterov", "module", "compression_start_step",
                   "granularity", "overlap", "process_group", "seed", "plugin_path", "params", "plugin_timeout",
                   "step_trace", "stream", "timeout")


class CompressionState:
    """The state of terse's DDP hook: the compressor, its codec chains and counters, and the overlap worker.

    compressor           a terse compressor plugin: a name found on the plugin path (`terse plugins list`) or a path
    **plugin_params      the plugin's parameters as typed keywords (bool, int, float or str): ratio=0.01, rank=4
    params               the same as a dict, for a parameter whose name is one of the keywords below
    error_feedback       terse's error feedback around the compressor, by error_feedback_rule
    error_feedback_rule  "ef" (default): the residual memory (Seide et al. 2014, Karimireddy et al. 2019); "ef21":
                         EF21 (Richtarik et al. 2021): each rank keeps an estimate of its gradient and sends the
                         compressed change to it, and the hook returns the mean of the estimates. Needs
                         error_feedback=True; not with momentum_correction, terse.local_sgd or a CUSTOM compressor
    ef21_momentum        EF21-SGDM's eta in (0, 1] (Fatkhullin et al. 2023): the estimates follow the moving average
                         (1 - eta) v + eta g; 1 (default) is plain EF21. With error_feedback_rule="ef21" only; below
                         1 it is the step's momentum, so the optimizer must then run without momentum of its own
                         (the state cannot see the optimizer: this is not checked here, as `terse run` checks it)
    momentum_correction  DGC momentum factor in [0, 1) (0 = off); implies error feedback, and the optimizer must then
                         run without momentum of its own
    momentum_masking, momentum_nesterov   DGC's options (terse's momentum-correction decorator)
    compression_start_step  a dense warm-up, as torch's PowerSGDState's start_powerSGD_iter: the first N backward
                         passes average every bucket uncompressed (one allreduce, the compressor not called), and the
                         compressor with its error feedback takes over at pass N, its state starting there. An int >= 0
                         (default 0: every pass compresses); not with momentum_correction or terse.torch.LocalSGD
    module               the model (or its DDP wrapper): its parameter order gives the tensor ids; its device is
                         checked here, before anything is registered
    granularity          "tensor" (default) or "bucket"; see the module's documentation
    overlap              True (default): overlap backward, chained on asynchronous collectives for a one-round SUM
                         compressor on CPU gradients, else on a worker thread; "chain": chained where it can be, for
                         every SUM compressor on CPU gradients (PowerSGD round by round too) and on CUDA gradients a
                         one-round one or PowerSGD (its checks stay on the device), else on the worker; "thread":
                         always on the worker thread; False: inside the
                         hook (see the module's text)
    stream               CUDA gradients: "current" runs the codecs and collectives on torch's current stream as the
                         state first sees it; "side" on a stream of the state's own, which waits for each bucket's
                         gradients on the device (see the module's text); None (default): "side" when the state chains
                         its buckets (overlap="chain"), else "current". On "current" the kernels backward queues after a
                         bucket's aggregation wait for its collective on the device: with several GPUs that holds
                         backward up while a bucket is on the network, which "side" does not (not yet measured on a
                         cluster). No effect on CPU gradients
    process_group        the DDP process group (None: the default group). With module= a DDP wrapper made with
                         find_unused_parameters=True, the state issues its collectives on a group of its own with the
                         same ranks (made once by every rank, reused by later states), since DDP's own all_reduce of
                         its used-parameter map would otherwise interleave with terse's overlapped collectives; pass the
                         DDP wrapper, not the model it wraps, as module= whenever DDP finds unused parameters. That
                         group has the timeout of DDP's group (init_process_group's timeout=)
    timeout              a datetime.timedelta: the timeout of that group of the state's own instead of DDP's group's;
                         needed only where torch does not show DDP's group's timeout (a backend other than gloo and
                         NCCL), and refused for a state that makes no group of its own. The group is made once a
                         process: every state beside one DDP group gives the same timeout
    seed                 the run seed (random-k's shared stream, stochastic rounding): a non-negative int
    plugin_path          directories searched first: before a pip-installed package's own plugins, TERSE_PLUGIN_PATH,
                         the installation's plugins and (the build tree's package only) the build tree's; each must be
                         a folder (terse.InvalidArgument names one that is not)
    step_trace           record this rank's step trace for `terse whatif` (needs module=); see the module's text
    plugin_timeout       seconds one compressor call may run (default 60; 0 = no limit; at most 3600). The process's
                         deadline: the last state made sets it. A call past it fails its bucket with terse.PluginError
                         naming the plugin, the call and the tensor, so backward raises; the hung thread is abandoned.
                         Without overlap, or chained (the encode runs in the hook call, the decode on
                         torch.distributed's thread), the hung call holds a thread nothing can free, so the process
                         marks its results status failed, writes terse run's error file, prints the error and exits
                         with status 1 instead; overlap="thread" keeps every plugin call on the worker, where a hang
                         fails its bucket and backward raises

    Raises terse.PluginError, terse.InvalidArgument, terse.Unsupported ... with terse's messages, before any
    collective.
    """

    def __init__(self, compressor, *, error_feedback=False, momentum_correction=0.0, momentum_masking=True,
                 momentum_nesterov=False, module=None, granularity="tensor", overlap=True, process_group=None,
                 seed=1, plugin_path=(), params=None, plugin_timeout=60.0, step_trace=False, stream=None,
                 timeout=None, error_feedback_rule="ef", ef21_momentum=1.0, compression_start_step=0,
                 **plugin_params):
        _require(isinstance(compressor, (str, os.PathLike)) and str(compressor),
                 "compressor must be a plugin name or path, got %r" % (compressor,))
        for key, value in (("error_feedback", error_feedback), ("momentum_masking", momentum_masking),
                           ("momentum_nesterov", momentum_nesterov), ("step_trace", step_trace)):
            _require(isinstance(value, bool), "'%s' must be True or False, got %r" % (key, value))
        _require(isinstance(overlap, bool) or overlap in ("thread", "chain"),
                 "'overlap' must be True, False, 'thread' or 'chain', got %r" % (overlap,))
        _require(isinstance(momentum_correction, numbers.Real) and not isinstance(momentum_correction, bool),
                 "'momentum_correction' must be a number in [0, 1), got %r" % (momentum_correction,))
        _require(error_feedback_rule in ("ef", "ef21"),
                 "'error_feedback_rule' must be 'ef' or 'ef21', got %r" % (error_feedback_rule,))
        _require(isinstance(ef21_momentum, numbers.Real) and not isinstance(ef21_momentum, bool)
                 and 0 < ef21_momentum <= 1,
                 "'ef21_momentum' must be a number in (0, 1] (1 = plain EF21), got %r" % (ef21_momentum,))
        _require(error_feedback_rule != "ef21" or error_feedback,
                 "error_feedback_rule='ef21' with error_feedback=False: the rule says which error feedback "
                 "error_feedback turns on; pass error_feedback=True")
        _require(ef21_momentum == 1 or error_feedback_rule == "ef21",
                 "ef21_momentum=%r with error_feedback_rule=%r: the momentum is EF21-SGDM's; pass "
                 "error_feedback_rule='ef21' or leave ef21_momentum unset" % (ef21_momentum, error_feedback_rule))
        _require(isinstance(compression_start_step, numbers.Integral) and not isinstance(compression_start_step, bool)
                 and 0 <= compression_start_step <= 10 ** 9,
                 "'compression_start_step' must be an integer in [0, 1e9] (backward passes averaged uncompressed "
                 "first), got %r" % (compression_start_step,))
        _require(compression_start_step == 0 or momentum_correction == 0,
                 "compression_start_step=%d with momentum_correction=%r: DGC's momentum lives in the compressor's "
                 "decorator, which the dense passes do not run, and the optimizer must run without momentum beside it, "
                 "so they would have none at all; use the optimizer's momentum with error_feedback=True, or "
                 "compression_start_step=0" % (compression_start_step, momentum_correction))
        _require(isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and 0 <= seed < 2 ** 64,
                 "'seed' must be an integer in [0, 2^64), got %r" % (seed,))
        _require(granularity in ("tensor", "bucket"), "granularity must be 'tensor' or 'bucket', got %r"
                 % (granularity,))
        _require(stream in (None, "current", "side"), "stream must be 'current' or 'side' (or None), got %r"
                 % (stream,))
        _require(params is None or isinstance(params, dict), "'params' must be a dict, got %r" % (params,))
        _require(module is None or isinstance(module, torch.nn.Module),
                 "'module' must be a torch.nn.Module (the model or its DDP wrapper), got %s" % _described(module))
        _require(not step_trace or module is not None,
                 "step_trace=True needs module= (the model or its DDP wrapper): the trace names its parameters and "
                 "times its modules' forward")
        _require(isinstance(plugin_timeout, numbers.Real) and not isinstance(plugin_timeout, bool)
                 and 0 <= plugin_timeout <= 3600,
                 "'plugin_timeout' must be a number of seconds in [0, 3600] (0 = no limit), got %r" % (plugin_timeout,))
        _require(timeout is None or (isinstance(timeout, datetime.timedelta) and timeout > datetime.timedelta(0)),
                 "'timeout' must be a datetime.timedelta longer than zero (or None: the timeout of DDP's group), got %s;"
                 " a plugin's parameter named timeout goes in params={'timeout': ...}" % _described(timeout))
        merged = {}
        for key, value in list((params or {}).items()) + list(plugin_params.items()):
            _require(isinstance(key, str), "compressor parameter names must be strings, got %r" % (key,))
            _require(key not in merged, "compressor parameter '%s' is given twice (params= and a keyword)" % key)
            merged[key] = _plugin_value(key, value)
        device = _module_device(module) if module is not None else None
        if device is not None and device.type not in ("cpu", "cuda"):
            raise _terse.Unsupported(
                "terse.torch: the module's parameters are on %s; this hook aggregates CPU tensors (gloo) and CUDA "
                "tensors (NCCL, or gloo) only -- compressor '%s' cannot run there" % (device, compressor))

        process_group = _group_of_its_own(module, process_group, timeout)
        try:
            self._agg = _terse.DdpAggregator(
                compressor=str(compressor), params=merged, error_feedback=error_feedback,
                momentum_correction=float(momentum_correction), momentum_masking=momentum_masking,
                momentum_nesterov=momentum_nesterov, seed=int(seed), plugin_path=_search_path(plugin_path),
                granularity=granularity, group=process_group, error_feedback_rule=error_feedback_rule,
                ef21_momentum=float(ef21_momentum), compression_start_step=int(compression_start_step))
        except _terse.InvalidArgument as e:
            # A keyword that is neither the plugin's nor the state's reaches the plugin, which names only its own
            # parameters: a misspelt error_feedback= read as the plugin's fault. Say which keyword of the state's
            # it is close to.
            for key in plugin_params:
                near = difflib.get_close_matches(key, _STATE_KEYWORDS, n=1, cutoff=0.75)
                if near and ("unknown parameter '%s'" % key) in str(e):
                    raise _invalid("%s -- nor is '%s' a keyword of CompressionState: did you mean %s=?"
                                   % (e, key, near[0])) from None
            raise
        if module is not None:
            # What the first bucket of each dtype would refuse, refused now (module= shows the dtypes).
            named = {}
            for name, p in module.named_parameters():
                if p.requires_grad:
                    named.setdefault(str(_real_dtype(p.dtype)), []).append(name)
            for dtype in sorted(named):
                try:
                    self._agg.check_dtype(dtype)
                except _terse.Error as e:
                    # The plugin's refusal names the dtype; the parameters that hold it are the user's to change.
                    names = named[dtype]
                    raise type(e)("%s (the module's parameters of that dtype: %s%s; convert them, e.g. module.float(), "
                                  "or choose a compressor that takes %s)"
                                  % (e, ", ".join(names[:8]), " and %d more" % (len(names) - 8) if len(names) > 8
                                     else "", dtype)) from None
        self.compressor = str(compressor)
        # What every rank's state must agree on, compared across the ranks at the first bucket (_check_agreement):
        # the plugin (by name and version, not by path: ranks may load it from different places) and every setting
        # that changes the collectives or the bits.
        plugin = self._agg.plugin
        # A step trace changes the path (a traced state never chains), so it is compared too. A plugin parameter that
        # differs by design between ranks is refused as any other: the plugin's payloads must agree.
        self._settings = {"compressor": "%s %s" % (plugin["name"], plugin["version"]),
                          "params": " ".join("%s=%s" % kv for kv in sorted(merged.items())),
                          "error_feedback": error_feedback, "error_feedback_rule": error_feedback_rule,
                          "ef21_momentum": float(ef21_momentum) + 0.0,
                          "compression_start_step": int(compression_start_step),
                          "momentum_correction": float(momentum_correction) + 0.0,
                          "momentum_masking": momentum_masking, "momentum_nesterov": momentum_nesterov,
                          "granularity": granularity, "overlap": overlap, "step_trace": step_trace, "seed": int(seed)}
        self._agreed = False
        self._device = None  # the bound gradients' device (cpu, or cuda:N), None until bound
        self._stream = None  # CUDA: the torch.cuda.Stream the state's codecs and collectives are ordered on
        self._nccl = False  # CUDA: whether the process group's backend is NCCL (_bind)
        self.stream = stream  # "current", "side" or None (chosen by _bind): which stream a CUDA state binds
        self.overlap = overlap  # _bind reads these two to choose the stream
        self._step_trace = step_trace
        self.process_group = process_group
        if device is not None:
            self._bind(device)  # refusals (a plugin without CUDA code, the backend) before anything is registered
        self.params = merged
        self._ids = {} if module is None else {id(p): i for i, p in enumerate(module.parameters())}
        self._fixed_ids = module is not None
        self.error = None  # terse's exception of the first bucket that failed
        self._queue = None
        self._worker = None
        self._last_submit = 0.0
        self._current = None       # the Future of the bucket the worker aggregates now
        self._stuck = False        # a plugin call of the worker overran plugin_timeout: the worker is abandoned
        self._chain = None         # whether buckets are chained on asynchronous collectives (_chains), once bound
        self._inflight = []        # chained: the Futures handed to DDP that may not be complete yet
        self._sequencer = None     # chained: the order of the collectives (_Sequencer), from the first bucket
        self._recent = collections.deque(maxlen=32)  # chained: the last rounds' views (_Sequencer._issue says why)
        self._children = collections.deque(maxlen=32)  # chained: the last rounds' then() Futures (_Sequencer._chain)
        self._decoding = set()     # chained: the native ids of threads inside a chained bucket's decode
        self._sync_thread = None   # overlap=False: the native id of the thread inside the hook, while it is
        _terse.set_plugin_timeout(float(plugin_timeout))
        self.plugin_timeout = float(plugin_timeout)
        self._local_sgd = None  # the terse.torch.LocalSGD built on this state, if any (ResultsLogger logs it)
        self._logged = None     # the ResultsLogger logging this state, if any
        self._tracer = None
        if step_trace:
            spec = self.compressor + "".join(("," if i else ":") + "%s=%s" % kv
                                             for i, kv in enumerate(sorted(merged.items())))
            self._tracer = _StepTracer(self, module, spec)
            self._agg.trace_to(self._tracer.trace)
        ref = weakref.ref(self)
        self._watch = _terse.on_plugin_overrun(lambda message, thread: CompressionState._overrun_of(ref, message,
                                                                                                     thread))

    # ---- what the hook counted (each waits for the buckets in flight first)

    @property
    def step(self):
        """Backward passes aggregated so far (with a terse.torch.LocalSGD, its averagings too: its `steps` counts the
        optimizer steps)."""
        self._drain()
        return self._agg.step

    @property
    def device(self):
        """The device of the gradients the state aggregates (torch.device), None until the first bucket or module=
        shows it."""
        return self._device

    @property
    def rank(self):
        return self._agg.rank

    @property
    def world_size(self):
        return self._agg.world_size

    @property
    def plugin(self):
        """The loaded plugin: name, version, path, origin (how the loader found it), ABI version."""
        return self._agg.plugin

    @property
    def caps(self):
        """The compressor's caps for float32 gradients."""
        return self._agg.caps

    def buckets(self):
        """Per bucket index: numel, tensors, steps, and payload / wire bytes of the last step and in total."""
        self._drain()
        return self._agg.buckets()

    def totals(self):
        """This rank's payload and wire bytes (sent, received) over every bucket and step."""
        self._drain()
        return self._agg.totals()

    def times(self):
        """This rank's seconds: codec encode and decode, torch.distributed calls, the aggregation altogether
        (hook_s), and what backward waited for it (exposed_s: with overlap, from DDP's hand-over of its last bucket
        to that bucket's completion, summed over steps; without, all of hook_s)."""
        self._drain()
        return self._agg.times()

    def write_step_trace(self, folder):
        """Writes this rank's step trace (step_trace=True) as <folder>/steps.rank<R>.jsonl, creating the folder; the
        step in progress is closed first. ResultsLogger.finish() calls it with the results folder."""
        _require(self._tracer is not None, "write_step_trace: the state was built without step_trace=True")
        self._drain()
        self._tracer.close_step(_terse.monotonic())
        self._tracer.trace.write(str(folder))

    def raise_if_failed(self):
        """Raises terse's exception of the first bucket that failed, if one did."""
        if self.error is not None:
            raise self.error

    def close(self):
        """Waits for the buckets in flight and stops the worker thread (it starts again if the hook runs again). A worker
        stuck in a plugin call past plugin_timeout is left where it is. Chained, it also waits until torch has let go
        of the callbacks (_Callbacks): a gloo thread takes the GIL once more after each, and a process group destroyed
        meanwhile by a thread that holds the GIL (DDP's Reducer going away does that, joining gloo's threads) would
        wait for that thread forever. bench_ddp_hooks.py hung so, one run in about twenty, before close() waited."""
        if self._worker is not None:
            if not self._stuck:
                self._queue.put(None)
                self._worker.join()
            self._worker, self._queue = None, None
        if self._sequencer is not None:
            self._drain()
            # Bounded: a collective that never completes (a peer gone) keeps its callback. This state's callbacks
            # only: another state's chained step may go on meanwhile.
            _callbacks.wait(10.0, self)

    @staticmethod
    def _overrun_of(ref, message, thread):
        # Called on terse's watchdog thread (with the GIL) for any plugin call of the process past the deadline: this
        # state acts only when the call is its own.
        self = ref()
        if self is None:
            return
        held = None
        if self._sync_thread is not None and thread == self._sync_thread:
            held = "backward's thread"
        elif thread in self._decoding:
            # A collective's callback: on gloo's thread, or under NCCL at once on the thread that issued it.
            held = "the thread of a chained bucket's decode (a collective's callback)"
        if held is not None:
            # Nothing can free that thread, so the process ends; its results status and terse run's error file say why
            # first.
            text = "terse.torch: %s; the call holds %s, so the process exits" % (message, held)
            _terse.fail_process("rank %d: PluginError: %s" % (self.rank, text), self.compressor)
            sys.stderr.write(text + "\n")
            sys.stderr.flush()
            os._exit(1)
        worker = self._worker
        if worker is None or worker.native_id != thread:
            return
        error = _terse.PluginError("terse.torch: %s; the hook is stopped" % message)
        self._stuck = True
        self._fail(error)
        # The bucket in the hung call, then every bucket queued behind it: each fails now, so backward raises instead
        # of waiting for a call that will not return. The worker never takes another job.
        failed = [self._current] if self._current is not None else []
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            self._queue.task_done()
            if job is not None:
                failed.append(job[4])
        for fut in failed:
            if not fut.done():
                fut.set_exception(error if fut is self._current else self._failed_again())

    # ---- the hook's side

    def _tensor_id(self, param):
        key = id(param)
        tid = self._ids.get(key)
        if tid is None:
            if self._fixed_ids:
                raise _invalid("a bucket holds a parameter of shape %s that is not in the module given to "
                               "CompressionState" % (tuple(param.shape),))
            tid = len(self._ids)
            self._ids[key] = tid
        return tid

    def _bind(self, device):
        """Binds the state to `device` (see the module's text on devices); raises terse's refusal otherwise."""
        if device.type == "cpu":
            self._agg.bind_host()
        elif device.type == "cuda":
            device = torch.device("cuda", device.index if device.index is not None else torch.cuda.current_device())
            if self.stream is None:
                # A chained bucket waits for its collectives and decodes in their callback, which under NCCL runs at
                # once in the hook call: on torch's current stream, every backward kernel queued after it would wait
                # for the bucket's all_reduce. The chain decodes on a stream of its own; the worker keeps the stream
                # the H200 runs measured (the `stream` keyword says what that costs with several GPUs).
                # chainable is still the host's answer here (bind_cuda comes below), so the device's rule for several
                # rounds (DdpAggregator::chainable) is repeated: the two change together.
                chains = (self.overlap == "chain" and self._agg.chainable and not self._step_trace
                          and (self._agg.caps["num_rounds"] == 1 or self._agg.prev_checks_deferred))
                self.stream = "side" if chains else "current"
            stream = torch.cuda.Stream(device) if self.stream == "side" else torch.cuda.current_stream(device)
            self._agg.bind_cuda(device.index, stream.cuda_stream or _CUDA_STREAM_LEGACY)
            self._stream = stream
            # Whether the collectives' Futures carry CUDA events (NCCL's do, gloo's do not: _waited).
            self._nccl = torch.distributed.get_backend(self.process_group) == "nccl"
        else:
            raise _terse.Unsupported(
                "terse.torch: the gradients are on %s; this hook aggregates CPU tensors (gloo) and CUDA tensors "
                "(NCCL, or gloo) only -- compressor '%s' cannot run there" % (device, self.compressor))
        self._device = device

    def _on_stream(self):
        """The bound stream as torch's current one (CUDA), so that torch.distributed orders the collectives the
        aggregation issues after its kernels; nothing on the host."""
        if self._stream is None:
            return contextlib.nullcontext()
        scope = contextlib.ExitStack()
        # The device as well: terse's device buffers are allocated on the calling thread's current device.
        scope.enter_context(torch.cuda.device(self._device))
        scope.enter_context(torch.cuda.stream(self._stream))
        return scope

    def _hand_over(self, buf):
        """CUDA: the bound stream waits on the device for the stream that wrote the bucket (backward's current one),
        and torch's caching allocator learns that the bound stream uses the buffer; nothing when they are one."""
        current = torch.cuda.current_stream(self._device)
        if current != self._stream:
            self._stream.wait_stream(current)
            buf.record_stream(self._stream)

    def _check_agreement(self):
        """At the first bucket, before any collective of the state's own: every rank's settings are the same, or every
        rank raises InvalidArgument naming the settings that differ and each rank's value. Ranks built alike issue the
        same collectives in the same order; ranks that are not pair an all-gather of one with an all_reduce of another,
        which gloo answers with an abort and NCCL with a hang or a wrong sum. One all_gather of a fingerprint a rank
        (and, only when they differ, of the settings themselves)."""
        self._agreed = True
        if not torch.distributed.is_initialized():
            return  # no peers to disagree with (DDP needs a process group: a caller driving the hook by hand)
        group = self.process_group
        world = torch.distributed.get_world_size(group)
        if world == 1:
            return
        device = self._device if self._nccl else torch.device("cpu")

        def gather(mine):
            # Gathered and read on one stream: NCCL's wait orders only the stream current at the wait, so a read on
            # another (backward's, when the state binds a side one) could see the buffers before NCCL wrote them.
            with self._on_stream():
                return _all_gather_held(mine.to(device), world, group)

        found = _disagreeing(self._settings, world, gather)
        if found is None:
            return
        settings, differ = found
        # Where no value differs (a setting that reads alike but was written otherwise), the ranks' texts are shown
        # whole.
        if not differ:
            raise _invalid("the ranks' hook states differ: %s. Every rank must build its CompressionState alike: DDP "
                           "pairs the ranks' collectives one for one"
                           % "; ".join("rank %d: %s" % (r, json.dumps(s, sort_keys=True))
                                       for r, s in enumerate(settings)))
        raise _invalid("the ranks' hook states differ in %s: %s. Every rank must build its CompressionState alike: "
                       "DDP pairs the ranks' collectives one for one"
                       % (", ".join(differ), "; ".join("rank %d: %s" % (r, ", ".join("%s=%r" % (k, s.get(k))
                                                                                         for k in differ))
                                                       for r, s in enumerate(settings))))

    def _read_bucket(self, bucket):
        """What the aggregator needs of a DDP GradBucket, checked before anything is queued."""
        buf = bucket.buffer()
        if self._device is None:
            self._bind(buf.device)
        elif buf.device != self._device:
            raise _invalid("bucket %d is on %s, and this state aggregates the gradients of %s; a model's gradients "
                           "must all be on one device (build one state per device)"
                           % (bucket.index(), buf.device, self._device))
        if not self._agreed:
            self._check_agreement()
        if not buf.is_contiguous():
            raise _invalid("bucket %d's buffer is not contiguous" % bucket.index())
        members = []
        # Summed in place (an identity compressor: ddp_aggregator.h), a bucket is one tensor: nothing to read per
        # parameter. The aggregator says whether this bucket's dtype is (f32 only); any other goes to the plugin,
        # which refuses it by name, and needs its members for that.
        if ((self._agg.granularity == "tensor" or self._tracer is not None)
                and not self._agg.in_place_for(str(buf.dtype))):
            base, size = buf.data_ptr(), buf.element_size()
            end = 0  # where the members so far end in the buffer
            for param, grad in zip(bucket.parameters(), bucket.gradients()):
                # DDP's gradients() are views into the bucket's buffer; their offsets say where each tensor lies. An
                # empty one has no address of its own (torch gives it 0): it lies where the one before it ends.
                offset = (grad.data_ptr() - base) // size if grad.numel() else end
                members.append((self._tensor_id(param), offset, tuple(param.shape)))
                end = offset + grad.numel()
        return buf, members

    def _aggregate_traced(self, index, buf, members, is_last, issued):
        traced = [(tid, math.prod(shape)) for tid, _, shape in members]
        layout = members if self._agg.granularity == "tensor" else []
        self._agg.aggregate(index, buf.data_ptr(), buf.numel(), str(buf.dtype), layout, is_last, issued, traced)

    def _aggregate(self, index, buf, members, is_last, issued=None):
        if issued is not None:
            self._aggregate_traced(index, buf, members, is_last, issued)
        else:
            self._agg.aggregate(index, buf.data_ptr(), buf.numel(), str(buf.dtype), members, is_last)

    @contextlib.contextmanager
    def _aside(self):
        """A block of collectives that is no part of the script's optimizer step (an averaging's groups, a check of the
        replicas): the step trace leaves its time out of the open step's optimizer time, where a check would hold the
        wait for a slower rank."""
        start = _terse.monotonic()
        try:
            yield
        finally:
            if self._tracer is not None:
                self._tracer.aside(_terse.monotonic() - start)

    def _aggregate_owned(self, index, buf, members, is_last):
        """Averages a flat buffer of the caller's own across the ranks, inside the call, as overlap=False aggregates a
        bucket: terse.torch.LocalSGD's parameter deltas. `members` lists (tensor id, offset, shape) as _read_bucket
        reads them from a bucket; `index` keys the byte counts (and, with granularity "bucket", the pipeline)."""
        if self.error is not None:
            raise self._failed_again()
        self._drain()  # no bucket of DDP's in flight beside it: one aggregation at a time, in every rank's order
        if self._device is None:
            self._bind(buf.device)
        elif buf.device != self._device:
            raise _invalid("LocalSGD: the parameters are on %s, and this state aggregates the gradients of %s"
                           % (buf.device, self._device))
        if not self._agreed:
            self._check_agreement()
        if self._tracer is not None:
            # A group of the open step, issued now (the averaging after the optimizer step), its tensors the deltas'.
            with self._aside():
                issued = _terse.monotonic()
                self._run_owned(buf, lambda: self._aggregate_traced(index, buf, members, is_last, issued))
            return
        if self._agg.granularity != "tensor" or self._agg.in_place_for(str(buf.dtype)):
            members = []
        self._run_owned(buf, lambda: self._agg.aggregate(index, buf.data_ptr(), buf.numel(), str(buf.dtype), members,
                                                         is_last))

    def _average_dense(self, index, buf):
        """Averages a flat f32 buffer of the caller's own across the ranks, uncompressed and counted under `index`
        (terse.torch.LocalSGD's BatchNorm statistics): one allreduce, whatever the compressor, as _aggregate_owned
        orders it."""
        if buf.device != self._device:
            raise _invalid("LocalSGD: the buffers are on %s, and this state aggregates the tensors of %s"
                           % (buf.device, self._device))
        with self._aside():  # traced, a group of its own (ddp_aggregator.h, averageDense)
            self._run_owned(buf, lambda: self._agg.average_dense(index, buf.data_ptr(), buf.numel()))

    def _run_owned(self, buf, call):
        """Runs `call` (the aggregator on a buffer of the caller's own) on the bound stream, as the hook runs a bucket:
        the bound stream waits for the kernels that wrote `buf`, the caller's stream (training's, which reads the
        result next) waits for the bound one; the watchdog knows the thread; a failure fails the state."""
        self._sync_thread = threading.get_native_id()
        try:
            if self._stream is not None:
                self._hand_over(buf)
            with self._on_stream():
                call()
            if self._stream is not None:
                torch.cuda.current_stream(self._device).wait_stream(self._stream)
        except Exception as e:
            self._fail(e)
            raise
        finally:
            self._sync_thread = None

    def _fail(self, error):
        if self.error is None:
            self.error = error

    def _failed_again(self):
        # The same exception type, so that except clauses written for the first error catch the later ones too.
        return type(self.error)("terse.torch: an earlier bucket failed, the hook is stopped: %s" % (self.error,))

    def _submit(self, bucket):
        # Chained, a failure noticed on another thread stops the hook calls only from its place in the order on: the
        # calls before it must issue what every rank issues (_Sequencer).
        if self.error is not None and not (self._sequencer is not None and self._sequencer.admits()):
            raise self._failed_again()
        try:
            buf, members = self._read_bucket(bucket)
        except Exception as e:
            self._fail(e)
            if self._sequencer is not None:
                self._sequencer.refused()
            raise
        index, is_last = bucket.index(), bucket.is_last()
        issued = None
        if self._tracer is not None:
            issued = self._tracer.bucket(members, is_last)
        if self._chains():
            return self._submit_chained(index, buf, members, is_last)
        if self._stream is None:
            fut = torch.futures.Future()
        else:
            # CUDA-aware: set_result records an event on the bound stream, and DDP's wait makes its own stream wait
            # for it on the device.
            fut = torch.futures.Future(devices=[self._device])
            self._hand_over(buf)
        if not self.overlap:
            start = time.perf_counter()
            self._sync_thread = threading.get_native_id()
            try:
                with self._on_stream():
                    self._aggregate(index, buf, members, is_last, issued)
                    fut.set_result(buf)
            except Exception as e:
                self._fail(e)
                raise
            finally:
                self._sync_thread = None
            self._agg.add_exposed(time.perf_counter() - start)
            if self._tracer is not None:
                self._tracer.handed_back(is_last)
            return fut
        if self._worker is None:
            self._queue = queue.Queue()
            self._worker = threading.Thread(target=self._work, args=(self._queue,), daemon=True,
                                            name="terse.torch hook")
            self._worker.start()
            _live_states.add(self)
        # DDP reads the Future's value from C++, where an exception set from Python would arrive as the value, not as
        # an error; a callback that raises it turns it into the chained Future's error, as DDP's own hooks chain.
        # Chained before the job is queued: torch's then() lets the GIL go, and nothing between the put and the
        # return does, so the worker cannot complete a bucket before its hook call has returned.
        chained = fut.then(_value)
        # The buffer is held by the job until its Future completes: DDP does not reuse it before waiting.
        self._queue.put((index, buf, members, is_last, fut, time.perf_counter(), issued))
        if self._tracer is not None:
            self._tracer.handed_back(False)
        return chained

    def _chains(self):
        """Whether this state's buckets are chained on asynchronous collectives: no step trace (which times the
        aggregation's phases the worker's way), a SUM compressor (ddp_aggregator.cc, chainable), and on CPU gradients
        (the state is bound by now) overlap="chain", or overlap=True with a compressor of one round; on CUDA gradients
        overlap="chain" with a compressor of one round, or of several whose checks of prev stay on the device
        (chainable). A later round's encode runs in a callback on one of gloo's
        threads, where on the CPU it holds up the group's other collectives: PowerSGD chained took 4-12% more per step
        than on the worker (docs/pytorch.md), so True keeps multi-round compressors on the worker and "chain" asks for
        the chain. On CUDA the chain is not measured yet against the worker, which True keeps (the module's text)."""
        if self._chain is None:
            rounds = self._agg.caps["num_rounds"]
            if self._stream is None:
                rounds_ok = self.overlap == "chain" or (self.overlap is True and rounds == 1)
            else:
                # CUDA gradients: on request (the module's text says why). Several rounds only where their checks of
                # prev stay on the device (chainable): a later round's encode runs in the round before's callback,
                # under NCCL at once on backward's thread, which must not wait there.
                rounds_ok = self.overlap == "chain"
            self._chain = rounds_ok and self._tracer is None and self._agg.chainable
        return self._chain

    def _submit_chained(self, index, buf, members, is_last):
        """The chained path (see the module's text): one round, _OneRound.submit; several, this encodes the bucket's
        first round here and hands its sums to the state's _Sequencer, which issues them on torch.distributed's
        asynchronous all_reduce in the order every rank computes alike; a callback on each round's collectives finishes
        the round (the next round's encode, or the decode into the bucket) and completes the Future returned to DDP
        after the last. No callback waits for a collective, so buckets in flight never hold gloo's threads."""
        start = time.perf_counter()
        self._inflight = [f for f in self._inflight if not f.done()]
        if self._sequencer is None:
            rounds = self._agg.caps["num_rounds"]
            self._sequencer = _Sequencer(self, rounds) if rounds > 1 else _OneRound(self)
        if isinstance(self._sequencer, _OneRound):
            returned = self._sequencer.submit(index, buf, members, is_last, start)
            self._inflight.append(returned)
            return returned
        bucket = _ChainedBucket(self, buf)
        # A plugin call that hangs here holds backward's thread: the watchdog ends the process (_overrun_of).
        self._sync_thread = threading.get_native_id()
        try:
            if self._stream is not None:
                self._hand_over(buf)
            # CUDA: the encode's kernels on the bound stream (the collectives follow there: _Sequencer._issue).
            with self._on_stream():
                bucket.pending, sums = self._agg.begin_chained(index, buf.data_ptr(), buf.numel(), str(buf.dtype),
                                                               members, is_last)
        except Exception as e:
            self._fail(e)
            # The buckets in flight are not held behind this one's place (_Sequencer._pump).
            self._sequencer.add(bucket, is_last, start, None)
            raise
        finally:
            self._sync_thread = None
        # DDP reads the value from C++: an error set from Python must come through a raising callback (_submit).
        returned = bucket.result.then(_value)
        self._inflight.append(returned)
        self._sequencer.add(bucket, is_last, start, sums)
        return returned

    def _work(self, jobs):
        while True:
            job = jobs.get()
            try:
                if job is None:
                    return
                index, buf, members, is_last, fut, submitted, issued = job
                if self.error is not None:
                    fut.set_exception(self._failed_again())
                    continue
                self._current = fut
                with self._on_stream():
                    try:
                        self._aggregate(index, buf, members, is_last, issued)
                    except Exception as e:  # noqa: BLE001  (handed to DDP through the Future)
                        self._fail(e)
                        if not fut.done():
                            fut.set_exception(e)
                        continue
                    finally:
                        self._current = None
                    if fut.done():
                        continue  # the watchdog failed it: the call returned, but past its deadline
                    if is_last:
                        # Backward's own work ended about when DDP handed over its last bucket: what follows, it
                        # waits.
                        self._agg.add_exposed(time.perf_counter() - submitted)
                        if self._tracer is not None:
                            self._tracer.last_done()
                    fut.set_result(buf)  # on the bound stream: a CUDA Future records its event there
            finally:
                jobs.task_done()

    def _drain(self):
        if self._queue is not None:
            self._queue.join()
        for fut in self._inflight:
            # A failed bucket's error reaches the user through backward and state.error; here it only must be over.
            try:
                fut.wait()
            except Exception:  # noqa: BLE001, S110
                pass
        self._inflight = []


class _ChainedBucket:
    """One bucket on the chained path, from its hook call until its Future completes."""

    def __init__(self, state, buf):
        self.state = state
        self.buf = buf
        self.pending = None   # the aggregator's ChainedBucket, once its first round is encoded
        self.ordinal = None   # its place among the step's buckets (_Sequencer.add)
        self.round = 0        # the round whose sums are issued or next to be
        # CUDA: completed on the bound stream after the decode (a CUDA-aware Future records its event there), as
        # _OneRound's own Future is.
        self.result = torch.futures.Future(devices=[state._device]) if state._stream is not None else \
            torch.futures.Future()

    def summed(self, done, works, issued):
        """On the thread that completed the round's collectives (gloo's, or under NCCL the issuer's, at once): finishes
        the round, then hands over the next one or completes the bucket. CUDA: everything on the bound stream."""
        # Whatever escapes the round's own handling -- entering the stream's context, handing over the next round, a
        # CUDA-aware Future's set_result, which records an event and so meets a device error that came up after the
        # decode's launches -- fails the bucket: raised from here, it would go into a then() child nobody reads, and
        # DDP would wait for this bucket's Future forever.
        try:
            with self.state._on_stream():
                self._summed(done, works, issued)
        except Exception as e:  # noqa: BLE001
            self.state._fail(e)
            self.failed(e)

    def _summed(self, done, works, issued):
        state, sequencer = self.state, self.state._sequencer
        try:
            _waited(state, done, works)
        except Exception as e:  # noqa: BLE001
            # The transport broke: nothing more is issued, on any thread.
            self.fail(_comm_failed(e), sequencer.front())
            return
        if not sequencer.proceeds(self):
            self.fail(state._failed_again(), None)
            return
        thread = threading.get_native_id()
        state._decoding.add(thread)
        try:
            sums = state._agg.finish_chained(self.pending, time.perf_counter() - issued)
        except Exception as e:  # noqa: BLE001  (handed to DDP through the Future)
            # Its next round's encode failed on every rank alike: nothing from that round's place on is issued. A
            # failed decode stops nothing: it may be noticed after later rounds went out, at a moment that differs
            # between ranks, so the step's other buckets go on, and the next step is refused (_Sequencer._pump).
            last = self.round + 1 == sequencer.rounds
            self.fail(e, None if last else _place(self.ordinal, self.round + 1))
            return
        finally:
            state._decoding.discard(thread)
        self.round += 1
        if sums is not None:
            sequencer.next_round(self, sums)
            return
        # Out of the order before the Future completes: DDP starts the next step only after every bucket's Future,
        # and by then the sequencer has begun that step (_Sequencer._pump).
        sequencer.end(self, self.round)
        self.result.set_result(self.buf)

    def fail(self, error, where):
        """The bucket failed after its round `self.round`; `where`: the place in the order the failure stops (see
        _Sequencer), None when it stops nothing new."""
        self.state._fail(error)
        self.state._sequencer.end(self, self.round + 1, where)
        self.failed(error)

    def failed(self, error):
        if not self.result.done():
            self.result.set_exception(error)


class _Callbacks:
    """Counts the callbacks the chained path chains on torch.distributed's Futures until torch has let go of them.

    torch runs such a callback on gloo's thread, and afterwards takes the GIL once more to release it. Between the two,
    DDP's wait (or anyone's) may have returned and the interpreter begun to finalize, which ends a thread that asks
    for the GIL -- there inside gloo's C++ frames, so the process aborts at exit ("terminate called without an active
    exception"; tests/python/ddp_hook_test.py, chained_order, did one run in two). So each callback is counted until
    it is freed, and the exit handler (_stop_workers) lets the GIL go until none is left."""

    def __init__(self):
        self._alive = {}  # id(state) -> weak references to the callbacks torch still holds for that state
        self._changed = threading.Condition()

    def track(self, state, fn):
        # A plain weak reference, not weakref.finalize: finalize's own exit handler, registered after this module's,
        # runs before it and silences every finalizer, so a callback freed while the exit handler waits would never
        # be counted out.
        key = id(state)
        with self._changed:
            self._alive.setdefault(key, set()).add(weakref.ref(fn, functools.partial(self._freed, key)))
        return fn

    def _freed(self, key, ref):
        with self._changed:
            refs = self._alive.get(key)
            if refs is not None:
                refs.discard(ref)
                if not refs:
                    del self._alive[key]
            self._changed.notify_all()

    def count(self, state=None):
        """Callbacks torch still holds: of `state`, or of every state."""
        with self._changed:
            if state is None:
                return sum(len(refs) for refs in self._alive.values())
            return len(self._alive.get(id(state), ()))

    def wait(self, timeout, state=None):
        """Until torch has let go of every callback of `state` (of every state when None), or `timeout` seconds."""
        with self._changed:
            if state is None:
                self._changed.wait_for(lambda: not self._alive, timeout)
            else:
                self._changed.wait_for(lambda: id(state) not in self._alive, timeout)


_callbacks = _Callbacks()


def _comm_failed(e):
    """terse's error for a torch.distributed collective that could not be issued or did not complete."""
    return _terse.CommError("terse.torch: all_reduce failed: %s" % (e,))


def _collected(works):
    """One Future over a round's collectives (a completed one when the round has none): its value is the collective's
    own Future for one, the list of them for several (_waited)."""
    if not works:
        done = torch.futures.Future()
        done.set_result(None)
        return done
    if len(works) == 1:
        return works[0].get_future()
    return torch.futures.collect_all([w.get_future() for w in works])


def _waited(state, done, works):
    """Raises the first error among the collectives `works` behind _collected's Future `done`. CUDA: run under the
    state's bound stream (_on_stream), which it makes wait for them: NCCL's Futures carry the collectives' CUDA events,
    which the wait puts before the bound stream's next work; gloo's carry none -- with CUDA tensors it copies each sum
    back to the device on a stream of its own and completes the Future once only its thread's current stream waits for
    that copy -- so the bound stream is made to wait with Work.synchronize (Work.wait here would deadlock: gloo
    completes the work only after this callback)."""
    for f in (done.value() if len(works) > 1 else [done]):
        f.wait()
    if state._stream is not None and not state._nccl:
        for w in works:
            w.synchronize()


def _place(b, r):
    """Where round r of the step's b-th chained bucket is in the order of issue (_Sequencer): diagonal b + r, the
    diagonal's rounds from 0 up."""
    return (b + r, r)


class _Sequencer:
    """Issues the chained buckets' collectives of one state in one order that every rank computes alike.

    gloo pairs the collectives of a process group by the order they are issued in (each takes the group's next tag
    then), so every rank must issue the same collectives in the same order. A bucket's first round is issued from its
    hook call, on backward's thread, in DDP's bucket order. A later round can only be issued once the round before it
    completed, from a callback on one of gloo's threads, at a time that differs between ranks. Issued as soon as they
    are ready, the two would interleave differently on each rank: tried, the ranks deadlocked until gloo's timeout,
    and it is how DDP's own PowerSGD hook aborts in gloo with several buckets ("op.preamble.length <= op.nbytes").

    So the order is fixed beforehand, from the step's bucket order alone (_place): round r of the step's b-th bucket
    goes in diagonal b + r, the diagonals one after another and a diagonal's rounds from 0 up. With two rounds that is
    B0.0, B1.0, B0.1, B2.0, B1.1, B3.0, B2.1, ...: a bucket's second round goes after the next bucket's first, so a
    round rarely has to wait for the one before it to complete. Whichever thread makes an item ready issues every
    ready item at the front of the order, under the lock. An item not ready yet holds those behind it: a hook call may
    then return with its bucket's first round not issued, and the callback that readies the item in front issues it.
    Nothing ever waits in a hook call or a callback. A bucket with fewer rounds simply has no later items.

    Failures keep the order too. A plugin fails alike on every rank, but each rank notices it at another moment
    among its hook calls and callbacks. So a failure that keeps an item from being made has that item's place (a
    refused hook call: its bucket's first round; a failed encode: that round), and the items before that place are
    issued as ever, those after it never: the front of the order cannot pass an item before it is made or refused, so
    every rank issues the same collectives and none is left inside one. A failed decode keeps no item from being made
    and may be noticed after later items went out, so it stops nothing in its step. A broken collective stops at once
    (its transport is gone anyway). Once the state failed, the step's Futures fail or complete, and the next step's
    hook calls raise.
    """

    def __init__(self, state, rounds):
        self._state = state
        self.rounds = max(1, int(rounds))
        self._lock = threading.Lock()
        self._stop = None      # the place of the earliest failure: nothing from there on is issued
        self._closed = False   # the state failed and its step ended: every later hook call is refused
        self._begin_step()

    def _begin_step(self):
        self._handed = 0      # buckets handed over this step
        self._count = None    # the step's buckets, once its last is handed over
        self._open = 0        # handed over, and not yet decoded or failed
        self._ready = {}      # (ordinal, round) -> (bucket, sums): ready and not yet issued
        self._ended = {}      # ordinal -> the rounds it had (later items are skipped)
        self._last_start = 0.0
        self._order = self._positions()
        self._front = next(self._order)

    def _positions(self):
        k = 0
        while True:
            for r in range(self.rounds):
                b = k - r
                if b < 0:
                    break
                if self._count is None or b < self._count:
                    yield b, r
            if self._count is not None and k >= self._count + self.rounds - 2:
                return
            k += 1

    def _stops(self, place):
        return self._stop is not None and place >= self._stop

    def _stop_at(self, place):
        if place is not None and (self._stop is None or place < self._stop):
            self._stop = place

    def admits(self):
        """Whether the next hook call of the step comes before the failure's place (the state failed). A call past the
        step's last bucket belongs to a next step, which a failed state refuses."""
        with self._lock:
            if self._closed or (self._count is not None and self._handed >= self._count):
                return False
            return not self._stops(_place(self._handed, 0))

    def refused(self):
        """The next hook call was refused before its encode (its bucket's layout)."""
        with self._lock:
            self._stop_at(_place(self._handed, 0))
            issued = self._pump()
        self._chain(issued)

    def front(self):
        with self._lock:
            return _place(*self._front) if self._front is not None else None

    def proceeds(self, bucket):
        """Whether `bucket`, its round complete, goes on to its next round or decode."""
        with self._lock:
            return not self._stops(_place(bucket.ordinal, bucket.round + 1))

    def add(self, bucket, is_last, start, sums):
        """A hook call's bucket with its first round's `sums` (None: its encode failed, and so the state)."""
        with self._lock:
            bucket.ordinal = self._handed
            self._handed += 1
            if is_last:
                self._count, self._last_start = self._handed, start
            place = _place(bucket.ordinal, 0)
            failed = None
            if sums is None:
                self._stop_at(place)
                self._ended[bucket.ordinal] = 0
            elif self._stops(place):
                # Behind a failure noticed meanwhile: its round is never issued.
                self._ended[bucket.ordinal] = 0
                failed = self._state._failed_again()
            else:
                self._open += 1
                self._ready[(bucket.ordinal, 0)] = (bucket, sums)
            issued = self._pump()
        if failed is not None:
            bucket.failed(failed)
        self._chain(issued)

    def next_round(self, bucket, sums):
        with self._lock:
            self._ready[(bucket.ordinal, bucket.round)] = (bucket, sums)
            issued = self._pump()
        self._chain(issued)

    def end(self, bucket, rounds, stop=None):
        """`bucket` is decoded, or failed (`stop`: the place the failure stops), after `rounds` rounds: none of its
        later rounds is issued."""
        with self._lock:
            self._stop_at(stop)
            if bucket.ordinal not in self._ended:  # else failed by the pump already
                self._close(bucket.ordinal, rounds)
            issued = self._pump()
        self._chain(issued)

    def _close(self, ordinal, rounds):
        """An open bucket is decoded or failed after `rounds` rounds (the lock held): its later items are skipped."""
        self._ended[ordinal] = rounds
        self._open -= 1

    def _pump(self):
        """Issues the ready items at the front of the order (the lock held); returns what the caller chains on them
        outside the lock, since torch runs a callback on a complete Future at once."""
        out = []
        state = self._state
        while self._front is not None:
            b, r = self._front
            if self._stops(_place(b, r)):
                # Nothing from here on is issued: the ready items fail, and so do the rounds that become ready later
                # (proceeds, add). The front stays, and so does the step: the state failed.
                for (rb, _), (bucket, _) in sorted(self._ready.items()):
                    self._close(rb, bucket.round)
                    out.append((bucket, None, state._failed_again()))
                self._ready.clear()
                break
            entry = self._ready.pop((b, r), None)
            if entry is None:
                if self._ended.get(b, r + 1) > r:
                    break  # not ready
            else:
                bucket, sums = entry
                try:
                    out.append((bucket, self._issue(sums), None))
                except Exception as e:  # noqa: BLE001
                    error = _comm_failed(e)
                    if state.error is None:
                        state.error = error
                    self._stop_at(_place(b, r))
                    self._close(b, r)
                    out.append((bucket, None, error))
                    continue
            self._front = next(self._order, None)
        if self._front is None and self._open == 0:
            # The step is over: every bucket is decoded. From DDP's hand-over of the last bucket, backward's own work
            # had ended: what followed, it waited.
            state._agg.add_exposed(time.perf_counter() - self._last_start)
            if state.error is not None:
                self._closed = True  # a decode failed: the next step's hook calls are refused
            else:
                self._begin_step()
        return out

    def _issue(self, sums):
        # CUDA: issued on the bound stream, which NCCL's waits for, so the collective follows the round's encode.
        with self._state._on_stream():
            works = [torch.distributed.all_reduce(t, group=self._state.process_group, async_op=True) for t in sums]
        # The views stay referenced until some rounds later: gloo's thread must never drop the last reference to a
        # Python-made tensor, which needs the GIL (torch_communicator.h, in_call_).
        self._state._recent.append(sums)
        return works, time.perf_counter()

    @staticmethod
    def _chain(issued):
        for bucket, work, error in issued:
            if error is not None:
                bucket.failed(error)
                continue
            works, at = work
            collected = _collected(works)
            # A partial, not a lambda: an error raised under the callback keeps the frames of its traceback, and a
            # Python function's frame keeps the function, which would then outlive torch's use of it (_Callbacks).
            child = collected.then(_callbacks.track(bucket.state,
                                                    functools.partial(bucket.summed, works=works, issued=at)))
            # then()'s Future holds the callback's return value as a Python object; were gloo's thread to drop the last
            # reference to it, it would take the GIL once more after the callback, beyond what _Callbacks can see.
            bucket.state._children.append(child)


class _OneRound:
    """The chained path of a one-round compressor (none, fp16, bf16, randomk): what _Sequencer does, for buckets that
    each have one round. Their collectives are issued in the hook calls themselves, on backward's thread, in DDP's
    bucket order, which is every rank's order, and one then() callback decodes and completes the Future DDP waits for:
    the shape of DDP's own allreduce_hook. The sequencer's bookkeeping cost the MLP's one bucket about 0.3 ms a step
    against this (docs/pytorch.md, "none in place"). The step's last bucket is aggregated inside its hook call, after
    the others on the same group (_last says why), and so is backward's exposed time measured.

    Failures are placed as the sequencer places them. A hook call that fails (a refused layout, an encode) fails on
    every rank alike at that call, so every later call raises. A failed decode happens on gloo's thread, at a moment
    that differs between ranks: it stops nothing in its own step, whose remaining hook calls issue as ever on every
    rank, and the next step's calls raise. A broken collective stops everything at once."""

    def __init__(self, state):
        self._state = state
        self._lock = threading.Lock()
        self._step = 0             # the step the next hook call belongs to
        self._failed_step = None   # the step of the bucket whose decode failed
        self._refused = False      # a hook call failed, or a collective broke: every later call raises

    def admits(self):
        """Whether the next hook call goes ahead, the state having failed: only within the step of a failed decode."""
        with self._lock:
            return not self._refused and self._failed_step == self._step

    def refused(self):
        with self._lock:
            self._refused = True

    def submit(self, index, buf, members, is_last, start):
        state = self._state
        state._sync_thread = threading.get_native_id()
        try:
            if state._stream is not None:
                state._hand_over(buf)
            # CUDA: the encode's kernels and the collectives on the bound stream, which NCCL's stream waits for.
            with state._on_stream():
                pending, sums = state._agg.begin_chained(index, buf.data_ptr(), buf.numel(), str(buf.dtype),
                                                         members, is_last)
                works = [torch.distributed.all_reduce(t, group=state.process_group, async_op=True) for t in sums]
        except Exception as e:
            if isinstance(e, RuntimeError) and not isinstance(e, _terse.Error):
                e = _comm_failed(e)
            state._fail(e)
            self.refused()
            raise e
        finally:
            state._sync_thread = None
        issued = time.perf_counter()
        # The views stay referenced until some buckets later: gloo's thread must never drop the last reference to a
        # Python-made tensor (_Sequencer._issue).
        state._recent.append(sums)
        if is_last:
            return self._last(pending, buf, works, issued, start)
        with self._lock:
            step = self._step
        collected = _collected(works)
        # CUDA: the decode runs on the bound stream, which need not be the current stream of the thread that runs the
        # callback (NCCL's: the issuer's, at once; gloo's: its own), and then() would record the bucket's readiness on
        # the latter. So the bucket gets a CUDA-aware Future of its own, completed on the bound stream (as the worker's
        # are), and DDP gets its _value child.
        own = torch.futures.Future(devices=[state._device]) if state._stream is not None else None
        # DDP reads the value from C++: an error must be raised by the callback, not set (_submit). A partial, not a
        # lambda (_Sequencer._chain says why).
        child = collected.then(_callbacks.track(state, functools.partial(self._summed, pending, buf, works, issued,
                                                                         step, own)))
        if own is None:
            return child
        state._children.append(child)  # _Sequencer._chain says why it is kept
        return own.then(_value)

    def _last(self, pending, buf, works, issued, start):
        """The step's last bucket: nothing of backward is left to overlap it with, so the hook call waits for its
        collectives (torch's wait lets the GIL go) and decodes it here, and DDP waits for no callback on gloo's thread,
        which was what chaining cost a model of one bucket (docs/pytorch.md, "none in place"). Its collectives went out
        behind the step's others, in the order every rank issues them."""
        state = self._state
        try:
            try:
                # CUDA (NCCL): the current stream, the bound one here, waits for the collectives on the device.
                with state._on_stream():
                    for w in works:
                        w.wait()
            except Exception as e:  # noqa: BLE001
                error = _comm_failed(e)
                state._fail(error)
                self.refused()
                raise error from None
            state._sync_thread = threading.get_native_id()
            try:
                # CUDA: the decode on the bound stream; on a device this finish also reads the step's payload checks
                # (ddp_aggregator.h), the step's one synchronization, and a refusal among them raises here.
                with state._on_stream():
                    state._agg.finish_chained(pending, time.perf_counter() - issued)
            except Exception as e:
                state._fail(e)
                raise
            finally:
                state._sync_thread = None
        finally:
            with self._lock:
                self._step += 1
            # From DDP's hand-over of the last bucket, backward waited for this call.
            state._agg.add_exposed(time.perf_counter() - start)
        if state._stream is None:
            done = torch.futures.Future()
            done.set_result(buf)
            return done
        done = torch.futures.Future(devices=[state._device])
        with state._on_stream():
            done.set_result(buf)  # its event on the bound stream, after the decode
        return done

    def _summed(self, pending, buf, works, issued, step, own, done):
        """On the thread that completed the bucket's collectives (NCCL's: the issuer's, at once): decodes into the
        bucket and hands it to DDP, as then()'s value for CPU gradients, through `own` (the bucket's CUDA-aware Future,
        completed on the bound stream) for CUDA ones."""
        state = self._state
        try:
            # CUDA: the bound stream waits for the collectives (_waited says how, under NCCL and under gloo), and the
            # decode follows on it.
            with state._on_stream():
                try:
                    _waited(state, done, works)
                except Exception as e:  # noqa: BLE001
                    error = _comm_failed(e)
                    state._fail(error)
                    self.refused()
                    raise error from None
                thread = threading.get_native_id()
                state._decoding.add(thread)
                try:
                    state._agg.finish_chained(pending, time.perf_counter() - issued)
                except Exception as e:
                    state._fail(e)
                    self._decode_failed(step)
                    raise
                finally:
                    state._decoding.discard(thread)
                if own is not None:
                    own.set_result(buf)
        except Exception as e:  # noqa: BLE001
            if own is None:
                raise
            own.set_exception(e)  # DDP's child of it raises it (_value)
            return None
        return buf

    def _decode_failed(self, step):
        """A bucket's decode of `step` failed on gloo's thread: the rest of that step goes ahead (admits)."""
        with self._lock:
            if self._failed_step is None:
                self._failed_step = step


class _StepTracer:
    """The step trace of one CompressionState (experiments/python/hook_trace.h says what is recorded and why). Runs on
    the training thread (module hooks, the DDP hook) but for last_done(), which the overlap worker calls; the GIL
    orders them."""

    def __init__(self, state, module, compressor_spec):
        ddp = torch.nn.parallel.DistributedDataParallel
        inner = module.module if isinstance(module, ddp) else module
        prefix = "module." if isinstance(module, ddp) else ""
        self.state = state
        self._params = list(module.parameters())
        self._names = [n[len(prefix):] if prefix and n.startswith(prefix) else n for n, _ in module.named_parameters()]
        backend = torch.distributed.get_backend(state.process_group) if torch.distributed.is_initialized() else "none"
        # The compressor's own warm-up too (its phases: terse/phases_v1.h), which `terse whatif` sets aside as well.
        phases = state._agg.phase_steps
        self.trace = _terse.HookTrace(workload=type(inner).__name__, compressor=compressor_spec, backend=str(backend),
                                      compression_start_step=state._settings["compression_start_step"],
                                      compressor_phases_end=phases[-1] if phases else 0)
        # The modules that own parameters directly: each is a layer of the trace, numbered in the order the first traced
        # forward runs them.
        self._owners = [m for m in inner.modules() if next(m.parameters(recurse=False), None) is not None]
        self._order = {}  # owner index -> layer, from the first traced forward
        self._handles = [module.register_forward_pre_hook(self._forward_start),
                         module.register_forward_hook(self._forward_end)]
        self._wrapped = False  # inside the DDP wrapper's forward (the hooks above), which runs the inner module's
        if inner is not module:
            # A script that evaluates the inner model, not the wrapper (terse's driver with find_unused_parameters):
            # that forward ends the open step too, or the evaluation would count as its optimizer time.
            self._handles.append(inner.register_forward_pre_hook(self._inner_start))
        for i, owner in enumerate(self._owners):
            self._handles.append(owner.register_forward_hook(lambda m, inputs, output, i=i: self._owner_done(i)))
        self._forward = None  # the training forward in progress or last done: start, marks [(owner, t)], end, backward
        self._step = 0        # the next step to begin: backward passes that reached the hook (a local step's too)
        self._open = None     # the step begun and not yet closed: step, start, last (hand-over), done, ended

    # ---- forward (module hooks)

    def _inner_start(self, module, inputs):
        if not self._wrapped:
            self.close_step(_terse.monotonic())

    def _forward_start(self, module, inputs):
        now = _terse.monotonic()
        self._wrapped = True
        self.close_step(now)
        if not (torch.is_grad_enabled() and module.training):
            self._forward = None  # an evaluation's forward is not a training step's
            return
        batch = next((x.shape[0] for x in inputs if isinstance(x, torch.Tensor) and x.dim() > 0), 0)
        self._forward = {"start": now, "marks": [], "end": None, "backward": None, "batch": int(batch)}

    def _owner_done(self, owner):
        f = self._forward
        if f is not None and f["end"] is None:
            f["marks"].append((owner, _terse.monotonic()))

    def _forward_end(self, module, inputs, output):
        self._wrapped = False
        f = self._forward
        if f is None or f["end"] is not None:
            return
        f["end"] = _terse.monotonic()
        # Backward starts when the output's gradient is computed (the loss's own backward is a few operations).
        outputs = output if isinstance(output, (tuple, list)) else (output,)
        for out in outputs:
            if isinstance(out, torch.Tensor) and out.requires_grad:
                def started(grad, f=f):
                    if f["backward"] is None:
                        f["backward"] = _terse.monotonic()
                out.register_hook(started)
                break

    # ---- the hook's side

    def _describe(self, f):
        order = [] if f is None else [o for o, _ in f["marks"]]
        for o in order:
            self._order.setdefault(o, len(self._order))
        for o in range(len(self._owners)):  # owners the forward did not run: after the others
            self._order.setdefault(o, len(self._order))
        layer_of = {}
        for o, owner in enumerate(self._owners):
            for p in owner.parameters(recurse=False):
                layer_of.setdefault(id(p), self._order[o])
        last = max(self._order.values(), default=0)
        tensors = [(name, p.numel(), layer_of.get(id(p), last)) for name, p in zip(self._names, self._params)]
        self._layer_of = [t[2] for t in tensors]
        self.trace.describe(rank=self.state.rank, world=self.state.world_size,
                            batch_size=0 if f is None else f["batch"], layers=max(1, len(self._order)),
                            tensors=tensors)

    def bucket(self, members, is_last, local=False):
        """A bucket handed over by DDP: begins the step at its first bucket and records the backward that made the
        bucket ready. Returns the issue time for the aggregator's group. `local`: a local SGD step's bucket, which DDP
        gets back as it is -- its backward makes no tensor ready for a group (an averaging after the optimizer step
        sends the deltas, ready when the step's computation ends)."""
        now = _terse.monotonic()
        if self._open is None:
            f = self._forward
            if not self.trace.described:
                self._describe(f)
            step = self._step
            start = now if f is None else f["start"]
            self.trace.begin_step(step, start)
            last = start
            if f is not None:
                end = f["backward"] or f["end"] or now
                marks = f["marks"]
                for k, (owner, t) in enumerate(marks):
                    # The last module's segment runs on to backward's start: the loss is computed in it.
                    self.trace.forward(step, self._order.get(owner, 0), last, end if k == len(marks) - 1 else t)
                    last = end if k == len(marks) - 1 else t
                if not marks:
                    self.trace.forward(step, 0, start, end)
                last = end
            self._forward = None
            self._open = {"step": step, "start": start, "last": last, "done": None, "ended": False, "aside": 0.0}
        o = self._open
        ids = [tid for tid, _, _ in members]
        layer = min((self._layer_of[t] for t in ids if t < len(self._layer_of)), default=0)
        self.trace.backward(o["step"], layer, o["last"], max(now, o["last"]), [] if local else ids)
        if is_last:
            o["ended"] = True
            self._step += 1
        return now

    def handed_back(self, is_last):
        """The hook returns to DDP: backward goes on from here."""
        if self._open is not None:
            now = _terse.monotonic()
            self._open["last"] = now
            if is_last:
                self._open["done"] = now

    def last_done(self):
        """The overlap worker completed the step's last bucket."""
        if self._open is not None:
            self._open["done"] = _terse.monotonic()

    def aside(self, seconds):
        """Time after backward that is not the script's optimizer step: a LocalSGD averaging's groups, which the
        aggregator records as groups of the open step."""
        if self._open is not None:
            self._open["aside"] += seconds

    def close_step(self, now):
        """Closes the open step at `now` (the next forward, a record, the trace's writing) once its backward ended:
        what lies between backward's end and now, less the groups set aside, is the script's optimizer step (with
        LocalSGD, the averaging's own work too: the deltas, the outer step)."""
        o = self._open
        if o is None or not o["ended"]:
            return
        end = max(o["last"], o["done"] or o["last"])
        self.trace.optimizer(o["step"], end, max(now - o["aside"], end))
        self.trace.end_step(o["step"], max(now, end) - o["start"])
        self._open = None

    def remove(self):
        for h in self._handles:
            h.remove()
        self._handles = []


def _value(fut):
    return fut.value()  # raises the exception the worker set


def _trace_local_bucket(state, bucket):
    """terse.torch.LocalSGD's hook on a local step's bucket, which DDP gets back as it is: the state's step trace
    records the backward that made it (no tensor ready for a group), as the hook does a gradient step's."""
    tracer = state._tracer
    if tracer is None:
        return
    tracer.bucket([(state._tensor_id(p), 0, ()) for p in bucket.parameters()], bucket.is_last(), local=True)
    tracer.handed_back(bucket.is_last())


def compression_hook(state, bucket):
    """DDP communication hook: averages `bucket` across the process group through state's terse compressor.
    Register it as ddp_model.register_comm_hook(state, terse.torch.compression_hook)."""
    return state._submit(bucket)


@atexit.register
def _stop_workers():
    # A worker that takes the GIL while the interpreter finalizes is killed inside C++ frames; stop them first. The
    # queues are empty unless a backward was abandoned, and a failed state's queued buckets fail without collectives.
    for state in list(_live_states):
        state.close()
    # A collective that never completes (a peer gone) keeps its callback: the wait is bounded.
    _callbacks.wait(10.0)


def _param_bytes(module):
    return sum(p.numel() * p.element_size() for p in module.parameters())


def _file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _installed(path):
    """Whether `path` is a file of an installed package (a virtual environment's, say, kept in the module's folder):
    the package's version is what changes it, not the user's code."""
    parts = path.split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


def _code_provenance(description):
    """What provenance.json records of the run's code beyond terse's own (hook_results.h, ScriptProvenance): "hook"
    entries and a module workload's files, as (hook pairs, file pairs).

    The module named by the description (workload.pytorch.module): "module_sha256", its file's hash;
    "module_files_sha256", the hash of the sha256sum listing ("<hash>  <path>" lines, sorted by path) of every file of
    the module's folder tree that this process imported by now -- the module itself and the sys.modules entries whose
    file lies under its folder, packages installed there left out -- so a sibling the module imports changes it too;
    each file is listed under "module_files". Called once model() and data() have run, which may import more; a file
    first imported later (in the forward, say) is not listed. A relative path is not hashed: the description, text
    and not a file, has no config folder to name it from (terse.Recipe and terse run give it absolute), and the
    working directory's file of that name may be another one; the entry says so instead.

    "torchvision": its version, when this process has imported torchvision (a torchvision model, or a module or
    script that uses it); not imported, it cannot have changed the run, and importing it here would cost a second."""
    hook, files = [], []
    try:
        path = _terse.description_module(str(description)) if description else ""
    except _terse.Error:
        return [], []  # HookResults raises it, after its checks of the names, as before
    if path:
        if not os.path.isabs(path):
            hook.append(("module_sha256", "not recorded: %r is relative, and a description has no config folder to "
                         "resolve it from (give an absolute path, or terse.Recipe(config).text)" % path))
        else:
            main = os.path.realpath(path)
            folder = os.path.dirname(main)
            try:
                hook.append(("module_sha256", _file_sha256(main)))
            except OSError as e:
                hook.append(("module_sha256", "not recorded: %s: %s" % (path, e.strerror or e)))
            else:
                found = {main}
                for m in list(sys.modules.values()):
                    f = getattr(m, "__file__", None)
                    if not isinstance(f, str):
                        continue
                    f = os.path.realpath(f)
                    if f.startswith(folder + os.sep) and not _installed(os.path.relpath(f, folder)) \
                            and os.path.isfile(f):
                        found.add(f)
                for f in sorted(found, key=lambda f: os.path.relpath(f, folder)):
                    try:
                        files.append((os.path.relpath(f, folder), _file_sha256(f)))
                    except OSError as e:
                        files.append((os.path.relpath(f, folder), "not recorded: %s" % (e.strerror or e)))
                listing = "".join("%s  %s\n" % (h, name) for name, h in files)
                hook.append(("module_files_sha256", hashlib.sha256(listing.encode()).hexdigest()))
    torchvision = sys.modules.get("torchvision")
    if torchvision is not None and isinstance(getattr(torchvision, "__version__", None), str):
        hook.append(("torchvision", torchvision.__version__))
    return hook, files


class ResultsLogger:
    """A terse results folder for a PyTorch run: <root>/<study>/<variant>/ with config.textproto, provenance.json,
    metrics.jsonl and status.json, the folder `terse run` writes, so `terse compare` sets the run beside native ones.

    With `state=` (a CompressionState) the bytes and times are the hook's. With a terse.torch.LocalSGD as `state=`,
    they are its CompressionState's (the gradient steps' and the averagings'), the steps are the LocalSGD's count, and
    config.textproto's local_sgd block holds its schedule. Without one it records a run terse did not
    aggregate -- DDP's default allreduce or one of DDP's own hooks -- as a baseline: give `module=` (bytes per step
    default to a dense f32 allreduce of its parameters) or `bytes_per_step=` (the payload one worker hands to the
    allreduce per step, e.g. half the dense bytes for DDP's fp16_compress_hook), and pass `step=` to record().

    Rank 0 writes; every rank must construct the logger and call record() at the same points (it averages the
    ranks' counters with one all_reduce). `description` is an Experiment in text format (terse's experiment schema,
    not free text: `optimizer { lr: 0.1 }`), describing the recipe (workload, data, optimizer, epochs, ...) for
    config.textproto; see terse.Recipe.text. `study` and `variant` name folders, so they follow a config's rule:
    [A-Za-z0-9._-], not "." or ".." (terse.InvalidArgument otherwise, before anything is written). `variant` defaults
    to the compressor's name with `state=`, "ddp" without. `seed=N` makes the run one of the variant's repeats over
    seeds, written to <variant>/seed-N/ as `terse run --seeds` writes them, which `terse compare` shows as one row with
    intervals; with `state=` it must be the state's seed. provenance.json also records the code: the module the
    description names, with every file of its folder this process has imported by then (build the logger after
    model() and data() ran), and torchvision's version once imported (_code_provenance). `data_partition=` is the
    non-IID split the script trained on, as terse.Recipe(config).data_partition(world) gives it: provenance.json's
    "data_partition", as a native run of the config records it.

    record() after finish() raises terse.InvalidArgument. The first finish() settles the folder's status; a later one
    changes nothing (a `finally:` may call it again), but an error after the run was marked completed raises
    terse.InvalidArgument rather than being dropped.
    """

    def __init__(self, root, *, study="pytorch", variant=None, state=None, module=None, bytes_per_step=None,
                 compressor=None, process_group=None, description="", seed=None, data_partition=()):
        _require(isinstance(root, (str, os.PathLike)), "ResultsLogger: root must be a path, got %r" % (root,))
        if isinstance(data_partition, dict):
            data_partition = list(data_partition.items())
        _require(isinstance(data_partition, (list, tuple)) and all(
            isinstance(kv, (list, tuple)) and len(kv) == 2 and all(isinstance(x, str) for x in kv)
            for kv in data_partition),
            "ResultsLogger: data_partition must be terse.Recipe.data_partition(world)'s (key, value) strings, got %s"
            % _described(data_partition))
        data_partition = [tuple(kv) for kv in data_partition]
        _require(seed is None or (isinstance(seed, numbers.Integral) and not isinstance(seed, bool) and seed >= 0),
                 "ResultsLogger: seed must be a non-negative int (the repeat's seed), got %s" % _described(seed))
        seed = None if seed is None else int(seed)
        _require(isinstance(study, str) and study, "ResultsLogger: study must be a non-empty string, got %r"
                 % (study,))
        from .local_sgd import LocalSGD
        _require(state is None or isinstance(state, (CompressionState, LocalSGD)),
                 "ResultsLogger: state must be a terse.torch.CompressionState or LocalSGD, got %r" % (state,))
        if isinstance(state, CompressionState) and state._local_sgd is not None:
            state = state._local_sgd  # its steps, not the state's count of aggregations, which adds the averagings
        self._local = state if isinstance(state, LocalSGD) else None
        if self._local is not None:
            state = self._local.compression
        self.state = state
        if state is not None:
            _require(bytes_per_step is None and compressor is None,
                     "ResultsLogger: bytes_per_step and compressor describe a run without a terse hook; with state= "
                     "the hook's own counts are logged")
            # The loaded plugin's name, not state.compressor, which may be a path to its file.
            variant = state.plugin["name"] if variant is None else variant
            code_hook, module_files = _code_provenance(description)
            local = self._local
            self._results = _terse.HookResults(
                state._agg, str(root), study, str(variant), str(description), torch.__version__, repeat_seed=seed,
                code_hook=code_hook, module_files=module_files, data_partition=data_partition,
                local_sgd=None if local is None else (local.period, local.start_step, local.outer_lr,
                                                      local.outer_momentum, local.outer_nesterov, local.qsr_alpha))
            # Every rank writes its own step trace there (the path is the one rank 0's writer makes).
            self._folder = os.path.join(str(root), study, str(variant), *(() if seed is None else ("seed-%d" % seed,)))
            state._logged = self  # a LocalSGD built later would change what this logger counts: it refuses
            return
        if bytes_per_step is None:
            _require(module is not None, "ResultsLogger: a run without a terse hook needs module= or bytes_per_step=")
            _require(isinstance(module, torch.nn.Module),
                     "ResultsLogger: 'module' must be a torch.nn.Module (the model or its DDP wrapper), got %s"
                     % _described(module))
            bytes_per_step = _param_bytes(module)
        _require(isinstance(bytes_per_step, numbers.Integral) and not isinstance(bytes_per_step, bool)
                 and bytes_per_step >= 0, "ResultsLogger: bytes_per_step must be a non-negative integer, got %r"
                 % (bytes_per_step,))
        variant = "ddp" if variant is None else variant
        code_hook, module_files = _code_provenance(description)
        self._results = _terse.HookResults.baseline(process_group, str(root), study, str(variant),
                                                    str(compressor or "none"), int(bytes_per_step),
                                                    str(description), torch.__version__, repeat_seed=seed,
                                                    code_hook=code_hook, module_files=module_files,
                                                    data_partition=data_partition)

    @property
    def results_dir(self):
        """The results folder (on rank 0; None on the others)."""
        return self._results.dir

    def record(self, test_accuracy, test_loss=0.0, test_examples=0, train_loss=0.0, epoch=0.0, lr=0.0, step=None):
        """Appends an evaluation point to metrics.jsonl. Collective: call it on every rank at the same point, with
        test_accuracy as a fraction in [0, 1]. `step` (steps done) is required without a terse hook; with one it
        defaults to the hook's count of backward passes, with a LocalSGD to its count of steps."""
        self._results.check_open("record")  # before the drain and the collective: every rank raises alike
        if self.state is not None:
            self.state._drain()
            if self.state._tracer is not None:
                self.state._tracer.close_step(_terse.monotonic())
        _require(step is None or (isinstance(step, numbers.Integral) and step >= 0),
                 "ResultsLogger.record: step must be a non-negative integer, got %r" % (step,))
        if step is None and self._local is not None:
            step = self._local.steps
        self._results.record(test_accuracy=float(test_accuracy), test_loss=float(test_loss),
                             test_examples=int(test_examples), train_loss=float(train_loss), epoch=float(epoch),
                             lr=float(lr), step=-1 if step is None else int(step))

    def finish(self, error=None):
        """Marks the results folder completed, or failed with `error` (an exception or a message); a hook that
        failed marks it failed with its error even when `error` is not given. A second call changes nothing, but an
        error after the folder was marked completed raises terse.InvalidArgument."""
        if error is None and self.state is not None:
            error = self.state.error
        if error is None and self._local is not None:
            error = self._local.error  # an averaging that failed (a replica that diverged) outside the hook
        if self._results.finished:
            # The first call wrote the status and the step traces; this only refuses an error it would drop.
            self._results.finish(None if error is None else str(error))
            return
        if self.state is not None and self.state._tracer is not None and self.state._tracer.trace.described:
            # Before the status says completed: a finished folder holds its traces. A failed run's trace shows where
            # it stopped.
            try:
                self.state.write_step_trace(self._folder)
            except Exception as e:  # noqa: BLE001
                if error is None:
                    self._results.finish(str(e))
                    raise
        self._results.finish(None if error is None else str(error))


def __getattr__(name):
    """terse.torch.LocalSGD and local_sgd_hook, from terse/local_sgd.py, which builds on this module: imported when
    first asked for, so that either module can be imported first."""
    if name in ("LocalSGD", "local_sgd_hook"):
        from . import local_sgd
        return getattr(local_sgd, name)
    raise AttributeError("module %r has no attribute %r" % (__name__, name))
