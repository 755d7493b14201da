"""terse compressors as a PyTorch DistributedDataParallel communication hook.

    state, hook = terse.torch.ddp_hook("topk", params={"ratio": "0.01"}, error_feedback=True, module=model)
    ddp_model.register_comm_hook(state, hook)
    ...
    state.record(test_accuracy=acc, test_loss=loss)   # an evaluation point, on every rank (results_dir only)
    state.finish()                                     # marks the results folder completed

What runs per bucket is terse's, not a copy of it (terse/_terse, experiments/python/ddp_aggregator.h): the plugin is
found and validated by terse's loader, each tensor's codec chain is built by terse's make_codec (error feedback and
DGC momentum correction are terse's decorators), and terse's aggregation engine runs the collective the plugin's caps
ask for -- SUM: one allreduce of the summable payload; ALLGATHER: an all-gather of sizes, then of the payloads;
CUSTOM: an all-gather and the plugin's reduce fold; every round of a multi-round plugin such as PowerSGD -- over the
DDP process group through torch.distributed (experiments/python/torch_communicator.h). The bucket is averaged in place
and returned as an already-completed torch.futures.Future: the hook runs synchronously inside backward, so DDP's
overlap of communication with the rest of backward is not used (its built-in hooks overlap; ours do not yet).

Granularity (`granularity=`): "tensor" (the default) compresses each parameter of a bucket as its own tensor with its
shape, as terse's trainer does -- PowerSGD needs the matrices, top-k keeps k per tensor -- and fuses the bucket's
tensors into one collective per fusion class; "bucket" compresses the flat bucket as one vector. Tensor ids: with
`module=`, a parameter's index in module.parameters() (terse's own numbering for the same model, which keys the
random streams); without it, the order in which the hook first sees the parameters, which is the same on every rank.

Devices: CPU tensors with gloo. CUDA tensors are refused with terse.Unsupported: the CUDA path (the plugins' device
code on the current stream, NCCL) is not built into this hook, and Debian's torch has no CUDA to test it with.

Failures: a missing plugin, a bad parameter, a plugin that fails, a bucket layout the hook cannot serve -- each raises
terse's exception with terse's message, out of ddp_hook() or out of loss.backward(). Refusals happen before the
bucket's first collective, so when they hit every rank alike (the usual case: same plugin, same parameters, same
model) no rank is left waiting in one. A failure on one rank only leaves its peers in a gloo collective until this
process's connections close (it exits or calls torch.distributed.destroy_process_group()) or the group's timeout
expires: gloo cannot be aborted from Python.
"""

import torch

from . import _terse

__all__ = ["ddp_hook", "HookState"]


class HookState:
    """What ddp_hook returns as DDP's hook state: the aggregator, its counters and, with results_dir, the results."""

    def __init__(self, aggregator, param_ids, results):
        self._agg = aggregator
        self._ids = param_ids  # id(parameter) -> tensor id; filled as parameters are first seen when not given
        self._fixed_ids = bool(param_ids)
        self._results = results
        self.error = None  # the first exception the hook raised

    @property
    def step(self):
        """Backward passes aggregated so far."""
        return self._agg.step

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

    @property
    def results_dir(self):
        """The results folder (rank 0 with results_dir; None otherwise)."""
        return None if self._results is None else self._results.dir

    def buckets(self):
        """Per bucket index: numel, tensors, steps, and payload / wire bytes of the last step and in total."""
        return self._agg.buckets()

    def totals(self):
        """This rank's payload and wire bytes (sent, received) over every bucket and step."""
        return self._agg.totals()

    def times(self):
        """This rank's seconds: codec encode and decode, torch.distributed calls, and the hook altogether."""
        return self._agg.times()

    def record(self, test_accuracy, test_loss=0.0, test_examples=0, train_loss=0.0, epoch=0.0, lr=0.0):
        """Appends an evaluation point to metrics.jsonl (with results_dir; a no-op without). Collective: call it on
        every rank at the same point, with test_accuracy as a fraction in [0, 1]."""
        if self._results is not None:
            self._results.record(test_accuracy=float(test_accuracy), test_loss=float(test_loss),
                                 test_examples=int(test_examples), train_loss=float(train_loss), epoch=float(epoch),
                                 lr=float(lr))

    def finish(self, error=None):
        """Marks the results folder completed, or failed with `error` (a message)."""
        if self._results is not None:
            self._results.finish(None if error is None else str(error))

    def _tensor_id(self, param):
        key = id(param)
        tid = self._ids.get(key)
        if tid is None:
            if self._fixed_ids:
                raise _terse.InvalidArgument(
                    "terse.torch: a bucket holds a parameter of shape %s that is not in the module given to ddp_hook"
                    % (tuple(param.shape),))
            tid = len(self._ids)
            self._ids[key] = tid
        return tid


def _hook(state, bucket):
    buf = bucket.buffer()
    try:
        if buf.device.type != "cpu":
            raise _terse.Unsupported(
                "terse.torch: bucket %d is on %s; this hook aggregates CPU tensors (gloo) only -- the CUDA path is "
                "not built into it" % (bucket.index(), buf.device))
        if not buf.is_contiguous():
            raise _terse.InvalidArgument("terse.torch: bucket %d's buffer is not contiguous" % bucket.index())
        members = []
        if state._agg.granularity == "tensor":
            base, size = buf.data_ptr(), buf.element_size()
            for param, grad in zip(bucket.parameters(), bucket.gradients()):
                # DDP's gradients() are views into the bucket's buffer; their offsets say where each tensor lies.
                members.append((state._tensor_id(param), (grad.data_ptr() - base) // size, tuple(param.shape)))
        state._agg.aggregate(bucket.index(), buf.data_ptr(), buf.numel(), str(buf.dtype), members, bucket.is_last())
    except Exception as e:
        if state.error is None:
            state.error = e
            state.finish(error=e)
        raise
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut


def ddp_hook(compressor, params=None, error_feedback=False, momentum_correction=0.0, results_dir=None, *,
             module=None, granularity="tensor", process_group=None, seed=1, plugin_path=(), momentum_masking=True,
             momentum_nesterov=False, study="pytorch", variant=None, description=""):
    """Returns (state, hook) for DistributedDataParallel.register_comm_hook(state, hook).

    compressor           a terse compressor plugin: a name found on the plugin path (`terse plugins list`) or a path
    params               the plugin's parameters, a dict (values are passed as strings, as a config's params are)
    error_feedback       terse's residual memory around the compressor
    momentum_correction  DGC momentum factor in [0, 1) (0 = off); implies error feedback, and the optimizer must then
                         run without momentum of its own
    results_dir          a results root: rank 0 writes <results_dir>/<study>/<variant>/ as `terse run` does
    module               the model (or its DDP wrapper): its parameter order gives the tensor ids
    granularity          "tensor" (default) or "bucket"; see the module's documentation
    process_group        the DDP process group (None: the default group)
    seed                 the run seed (random streams of random-k, stochastic rounding)
    plugin_path          directories searched before TERSE_PLUGIN_PATH and the build/install trees
    study, variant       the results folder's names (variant defaults to the compressor's name)
    description          text-format fields of terse's experiment schema describing the recipe (workload, data,
                         optimizer, epochs, ...) for config.textproto; see terse.Recipe.text
    Raises terse.PluginError, terse.InvalidArgument, ... with terse's messages before anything is registered.
    """
    plugin_params = {str(k): str(v) for k, v in (params or {}).items()}
    aggregator = _terse.DdpAggregator(
        compressor=str(compressor), params=plugin_params, error_feedback=bool(error_feedback),
        momentum_correction=float(momentum_correction), momentum_masking=bool(momentum_masking),
        momentum_nesterov=bool(momentum_nesterov), seed=int(seed), plugin_path=[str(p) for p in plugin_path],
        granularity=str(granularity), group=process_group)
    ids = {}
    if module is not None:
        ids = {id(p): i for i, p in enumerate(module.parameters())}
    results = None
    if results_dir is not None:
        results = _terse.HookResults(aggregator, str(results_dir), str(study), str(variant or compressor),
                                     str(description), torch.__version__)
    return HookState(aggregator, ids, results), _hook
