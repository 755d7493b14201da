"""The driver `terse run` starts for workload pytorch (experiment.proto PyTorch; experiments/runner/pytorch_runner.cc):
trains one resolved variant with DistributedDataParallel and terse's hook, into the results folder terse run made.

    python3 -m terse.train EXPERIMENT.textproto --out ROOT --folder NAME [--plugin-path DIR]...

EXPERIMENT is one resolved variant in terse's text format (terse run writes it; terse.Recipe loads and validates it
with the runner's own loader). The run is the recipe's: the compressor with its parameters, error feedback and DGC
momentum correction through terse.torch.CompressionState; the optimizer block's kind (torch.optim's SGD with momentum
and Nesterov, Adam or AdamW with beta1, beta2 and eps), learning rate and schedule (terse's own, through
terse.Recipe.learning_rate, set every step), weight decay and gradient clipping; DDP's find_unused_parameters; data
.batch_size examples per worker per step; the eval block's evaluation points; the seed. ResultsLogger writes
<ROOT>/<study>/<NAME>/ on rank 0.

Ranks. Transport INPROC: `workers` processes of this host (torch.multiprocessing), joined through a file store.
Transport TCP: this process is one rank of a `terse launch` job (TERSE_RANK, TERSE_WORLD_SIZE, TERSE_MASTER_ADDR; torch's
TCP store listens on TERSE_MASTER_PORT + 1, beside terse's own store on TERSE_MASTER_PORT), or of a torchrun job when
torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set. Backend gloo on CPU, NCCL with device "cuda" (rank r
on GPU r mod the visible ones).

Data. torchvision models: Fashion-MNIST from data.dataset_dir (terse's IDX reader, data.train_subset and
test_subset), each 28x28 grey batch resized (bilinear) to image_size and repeated over `channels` as it is drawn, or
synthetic images and labels from the seed. A module's data(rank, world) gives this rank's shard and the test set,
each as two tensors or as a map-style Dataset of (x, y) items, which a DataLoader reads
(workload.pytorch.loader_workers).
The loss is the module's loss(output, labels) where it defines one, else cross-entropy of the output as logits;
accuracy is the argmax of the output's last dimension against the labels either way.
Every epoch each rank draws its shard in a permutation seeded by (seed, epoch, rank), or with data.partition
DIRICHLET visits its fixed non-IID shard in the native sampler's order (epoch_order); every rank takes the same number
of steps (the smallest shard's, cut at max_steps_per_epoch), since DDP needs every rank in every step.
"""

import argparse
import contextlib
import difflib
import hashlib
import importlib.util
import math
import multiprocessing
import os
import random
import re
import signal
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import numpy
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import terse
import terse.local_sgd
import terse.torch

FASHION_MNIST_CLASSES = 10


def _duration_s(text):
    """terse's duration text ("30s", "500ms", "2m") in seconds."""
    for suffix, scale in (("ms", 1e-3), ("us", 1e-6), ("s", 1.0), ("m", 60.0), ("h", 3600.0)):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * scale
    return float(text)


class Spec:
    """What every rank reads of the resolved experiment, the same on every rank."""

    def __init__(self, args):
        self.args = args
        self.recipe = terse.Recipe(args.experiment, "", args.plugin_path)
        e = self.recipe.experiment
        self.e = e
        self.text = self.recipe.text
        self.pt = e["workload"]["pytorch"]
        self.study = e["study"]
        self.workers = int(e.get("workers", 1))
        self.seed = int(e.get("seed", 1))
        self.epochs = int(e.get("epochs", 1))
        self.batch = int(e["data"]["batch_size"])
        opt = e.get("optimizer", {})
        self.momentum = float(opt.get("momentum", 0.0))
        self.nesterov = bool(opt.get("nesterov", False))
        self.weight_decay = float(opt.get("weight_decay", 0.0))
        self.clip = float(opt.get("clip_grad_norm", 0.0))
        # Unset (a resolved config of before the field, a driver started by hand) reads as the schema's defaults.
        self.optimizer = opt.get("kind", "SGD")
        self.betas = (float(opt.get("beta1", 0.9)), float(opt.get("beta2", 0.999)))
        self.eps = float(opt.get("eps", 1e-8))
        ev = e.get("eval", {})
        self.every_steps = int(ev.get("every_steps", 0))
        self.per_epoch = bool(ev.get("per_epoch", True))
        comp = e.get("compressor", {})
        self.compressor = comp.get("name", "none")
        self.params = dict(comp.get("params", {}))
        self.error_feedback = bool(e.get("error_feedback", False))
        # Unset: rule EF, and plain EF21's momentum (the loader leaves both unfilled).
        self.error_feedback_rule = "ef21" if e.get("error_feedback_rule", "EF") == "EF21" else "ef"
        self.ef21_momentum = float(e.get("ef21_momentum", 1.0))
        # int(): protobuf's JSON mapping writes an int64 as a string.
        self.compression_start_step = int(e.get("compression_start_step", 0))
        mc = e.get("momentum_correction", {})
        self.mc = float(mc.get("factor", 0.0))
        self.mc_masking = bool(mc.get("masking", True))
        self.mc_nesterov = bool(mc.get("nesterov", False))
        self.device = self.pt.get("device", "cpu")
        self.max_steps = int(self.pt.get("max_steps_per_epoch", 0))
        self.find_unused = bool(self.pt.get("find_unused_parameters", False))
        self.loader_workers = int(self.pt.get("loader_workers", 0))
        self.multi_process = e.get("transport", "INPROC") == "TCP"
        self.timeout_s = _duration_s(e.get("tcp", {}).get("timeout", "30s"))
        self.plugin_timeout_s = _duration_s(e.get("plugin_timeout", "60s"))
        # data.partition DIRICHLET (Fashion-MNIST images only: rule data-partition): the native run's non-IID shards.
        self.partitioned = e["data"].get("partition", "IID") == "DIRICHLET"
        self.local_sgd = terse.local_sgd.config_keywords(e)  # terse.torch.LocalSGD's keywords, or None
        # Every rank's steps.rank<R>.jsonl in the folder (the hook's step trace), for terse whatif.
        self.step_trace = bool(e.get("step_trace", False))


# ---- model and data


class WorkloadError(terse.ConfigError):
    """The driver's checks refused the variant's workload: the user's module, the torchvision name, data()'s return,
    the device, the batch against the shard. A config error only a run can find; terse run, told so (_write_error),
    skips the later variants with the same workload, data and workers (experiments/runner/runner.h,
    WorkloadRefused)."""


class PeerRefused(terse.Error):
    """Transport TCP: another rank failed before training: its checks refused the workload, its module failed, or
    anything else (_agree_before_training). This rank fails with that rank's reason and kind, so that its own terse run
    skips the same later variants as the failing rank's does (a rank left to train a variant its peers skipped would
    wait for them until the timeout)."""

    def __init__(self, rank, summary, kind):
        super().__init__("rank %d failed before training: %s" % (rank, summary))
        self.kind = kind


class UserCodeError(Exception):
    """An exception raised inside the user's module (importing it, its model() or data()): the one kind of failure
    whose traceback the driver prints, cut to the user's frames (_report), since the fix is in that code. What the
    driver finds wrong with the module from outside (no file, a syntax error, a missing function, data() returning the
    wrong thing) is a WorkloadError instead: one line naming the field and what is expected."""

    def __init__(self, what, path, error):
        message = _message(error)
        # An error out of a DataLoader worker carries the worker's traceback, whose last line names its type again.
        if message.startswith(type(error).__name__ + ": "):
            message = message[len(type(error).__name__) + 2:]
        super().__init__("%s in %s raised %s: %s" % (what, path, type(error).__name__, message))
        self.error = error


_MODULES = {}  # path -> the imported module, so that a rank of a TCP job imports it once (check_workload, train_rank)


_MODULE_FOLDERS = []  # what _load_module put on sys.path


def _load_module(path):
    if path in _MODULES:
        return _MODULES[path]
    # terse run has checked that the file exists (the config's validation); a driver started by hand has not.
    if not os.path.isfile(path):
        raise WorkloadError("workload.pytorch.module: no file %s" % path)
    spec = importlib.util.spec_from_file_location("terse_user_model", path)
    if spec is None or spec.loader is None:
        raise WorkloadError("workload.pytorch.module: cannot load %s as a Python module" % path)
    module = importlib.util.module_from_spec(spec)
    # As `python3 FILE` does: the module's folder first on sys.path, so that a model split over files imports its
    # siblings (`import mlp`). Left there for the process, as python3 leaves it, since model() and data() may import
    # too.
    folder = os.path.dirname(os.path.abspath(path))
    if not sys.path or sys.path[0] != folder:
        sys.path.insert(0, folder)
        _MODULE_FOLDERS.append(folder)
    try:
        spec.loader.exec_module(module)
    except SyntaxError as e:  # the file (or one it imports) is not Python: where, and the line, say it all
        where = "%s:%s:%s" % (e.filename, e.lineno, e.offset) if e.lineno else str(e.filename)
        text = (": " + e.text.strip()) if e.text and e.text.strip() else ""
        raise WorkloadError("workload.pytorch.module: %s: %s: %s%s" % (where, type(e).__name__, e.msg, text)) \
            from None
    except Exception as e:  # noqa: BLE001  (the module's own top-level code)
        raise UserCodeError("importing the module", path, e) from e
    for name, what in (("model", "model(), which returns the torch.nn.Module to train"),
                       ("data", "data(rank, world), which returns ((train_x, train_y), (test_x, test_y)) or Datasets")):
        if not callable(getattr(module, name, None)):
            raise WorkloadError("workload.pytorch.module: %s defines no %s" % (path, what))
    # loss is optional; a `loss` that is no function is a mistake to name, not a reason to train on cross-entropy.
    if hasattr(module, "loss") and not callable(module.loss):
        raise WorkloadError("workload.pytorch.module: %s defines loss as %s; the driver calls loss(output, labels) "
                            "for the training loss, so it must be a function (or absent: cross-entropy)"
                            % (path, _describe(module.loss)))
    _MODULES[path] = module
    return module


def _torchvision_constructor(spec):
    import torchvision  # only torchvision models need it

    name = spec.pt["torchvision"]
    # torchvision.models also holds submodules (resnet, vgg, ...), classes (ResNet) and helpers (get_model): a model
    # constructor is a lower-case function, as the names torchvision's own list_models() gives.
    known = [n for n, v in vars(torchvision.models).items()
             if callable(v) and not isinstance(v, type) and n[:1].islower() and not n.startswith(("get_", "list_"))]
    if name not in known:
        close = difflib.get_close_matches(name, known, n=3)
        hint = ("did you mean %s?" % " or ".join(map(repr, close)) if close
                else "not one of its %d model constructors, such as 'resnet18' or 'vit_b_16'" % len(known))
        raise WorkloadError("workload.pytorch.torchvision: torchvision %s has no model %r (%s)"
                            % (torchvision.__version__, name, hint))
    return getattr(torchvision.models, name)


def check_workload(spec):
    """What can be checked of the workload once, before any rank starts: the device, the model's name, the module's
    file and functions. Raises WorkloadError naming the field (UserCodeError for the module's own code)."""
    if spec.device == "cuda":
        # Otherwise init_process_group fails in every rank with "Distributed package doesn't have NCCL built in".
        build = "built without CUDA" if torch.version.cuda is None else "built with CUDA %s" % torch.version.cuda
        if not torch.cuda.is_available():
            raise WorkloadError('workload.pytorch.device: "cuda", but the torch %s of %s (%s) sees no CUDA device; '
                                'set device: "cpu" to train on the CPU over gloo, or run terse with a CUDA torch '
                                "(TERSE_PYTHON names its python3) on a machine with a GPU"
                                % (torch.__version__, sys.executable, build))
        if not dist.is_nccl_available():
            raise WorkloadError('workload.pytorch.device: "cuda" trains over NCCL, which the torch %s of %s lacks; '
                                'set device: "cpu" (gloo), or run terse with a torch built with NCCL '
                                "(TERSE_PYTHON names its python3)" % (torch.__version__, sys.executable))
    if "module" in spec.pt:
        _load_module(spec.pt["module"])
    else:
        _torchvision_constructor(spec)


def _cross_entropy(output, labels):
    """The loss of a module without loss() and of torchvision models: the output as logits over the labels."""
    return F.cross_entropy(output.reshape(-1, output.shape[-1]), labels.reshape(-1))


def loss_function(user):
    """loss(output, labels) of the user's module where it defines one, else cross-entropy over logits."""
    return user.loss if user is not None and hasattr(user, "loss") else _cross_entropy


def build_model(spec, user):
    if user is not None:
        try:
            model = user.model()
        except Exception as e:  # noqa: BLE001
            raise UserCodeError("model()", spec.pt["module"], e) from e
        if not isinstance(model, torch.nn.Module):
            raise WorkloadError("workload.pytorch.module: model() in %s returned %s, not a torch.nn.Module"
                                % (spec.pt["module"], _describe(model)))
    else:
        model = _torchvision_constructor(spec)(num_classes=int(spec.pt["num_classes"]))
    return model


def _describe(value, depth=0):
    """A short account of what user code returned: "(Tensor[64, 4] float32, Tensor[64] int64)"."""
    if isinstance(value, torch.Tensor):
        return "Tensor[%s] %s" % (", ".join(str(d) for d in value.shape), str(value.dtype).replace("torch.", ""))
    if isinstance(value, (tuple, list)):
        if depth >= 2 or len(value) > 4:
            return "a %s of %d" % (type(value).__name__, len(value))
        inner = ", ".join(_describe(v, depth + 1) for v in value)
        return "(%s%s)" % (inner, "," if len(value) == 1 else "") if isinstance(value, tuple) else "[%s]" % inner
    module = type(value).__module__
    return type(value).__name__ if module == "builtins" else module + "." + type(value).__name__


# ---- examples: what data() gives, as tensors or as Datasets


class TensorExamples:
    """Examples held as two tensors: x with the examples along dimension 0, y their int64 labels. A batch is an
    indexing of both, in the rank's process."""

    dataset = False

    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def head(self, n):
        return self.x[:n], self.y[:n]

    def labels(self):
        """Every label, for the check of their range before training."""
        return self.y

    def batches(self, order, batch, steps, generator=None):
        for b in range(steps):
            index = order[b * batch:(b + 1) * batch]
            yield self.x[index], self.y[index]

    def in_order(self, batch):
        for i in range(0, len(self.y), batch):
            yield self.x[i:i + batch], self.y[i:i + batch]


class DatasetExamples:
    """Examples data() gave as a map-style torch.utils.data.Dataset of (x, y) items, read through torch's DataLoader:
    `workers` processes (workload.pytorch.loader_workers; 0 reads in the rank's process), batches made by
    default_collate, pinned memory for a CUDA model. The driver still draws the order (the same permutation as for
    tensors), so the batches are those of tensor examples holding the same items. Each batch is checked as it comes (a
    pair of tensors, integer labels within the model's classes), since the items cannot all be read before training."""

    dataset = True

    def __init__(self, data, part, where, path, workers, pin):
        self.data, self.part, self.where, self.path = data, part, where, path
        self.workers, self.pin = workers, pin
        self.classes = None  # the model's class scores an example, once the check forward has seen them

    def __len__(self):
        return len(self.data)

    def _batch(self, item, what):
        """A collated batch as (x, y): x a tensor, y int64 labels; else WorkloadError saying what came."""
        if not (isinstance(item, (tuple, list)) and len(item) == 2):
            raise WorkloadError("%s: %s of the %s Dataset collate to %s; its items must be (x, y) pairs"
                                % (self.where, what, self.part, _describe(item)))
        x, y = item
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise WorkloadError("%s: %s of the %s Dataset collate to %s; an item's x and y must be tensors, numpy "
                                "arrays or numbers" % (self.where, what, self.part, _describe(item)))
        if not _class_indices(y):
            raise WorkloadError("%s: %s of the %s Dataset have labels of %s; labels are class indices, of an integer "
                                "type (int, or a tensor of torch.long)" % (self.where, what, self.part, _dtype(y)))
        if self.classes is not None:
            _check_label_range(self.where, "%s of the %s Dataset" % (what, self.part), y, self.classes)
        return x, y.long()

    def head(self, n):
        """The first n items, collated as a training batch is: checked before any DataLoader starts, so that the
        commonest mistakes (a PIL image without ToTensor, a tuple of three) are one line naming the item."""
        items = []
        for i in range(n):
            try:
                item = self.data[i]
            except Exception as e:  # noqa: BLE001  (the module's own __getitem__)
                raise UserCodeError("the %s Dataset's item %d (data(rank, world)'s %s)" % (self.part, i, self.part),
                                    self.path, e) from e
            if not (isinstance(item, (tuple, list)) and len(item) == 2):
                raise WorkloadError("%s: item %d of the %s Dataset is %s; expected an (x, y) pair"
                                    % (self.where, i, self.part, _describe(item)))
            items.append(item)
        try:
            batch = torch.utils.data.default_collate(items)
        except (TypeError, RuntimeError) as e:
            raise WorkloadError("%s: the first %d items of the %s Dataset (item 0: %s) do not collate into a batch: "
                                "%s; the driver batches items with torch's default_collate, which takes tensors, "
                                "numpy arrays and numbers of one shape (torchvision.transforms.ToTensor() converts a "
                                "PIL image)" % (self.where, n, self.part, _describe(items[0]), _message(e))) from None
        return self._batch(batch, "its first %d items" % n)

    def labels(self):
        return None  # unknown before the items are read; each batch is checked instead

    def _loader(self, batch, sampler=None, generator=None, drop_last=False):
        # Workers forked, as torch's default on Linux: a rank is a process mp.spawn started, whose default is spawn,
        # which pickles the Dataset to each worker, and a class of the user's module (imported from its file, not by
        # a name the worker could import) does not pickle.
        context = "fork" if self.workers > 0 and "fork" in multiprocessing.get_all_start_methods() else None
        return torch.utils.data.DataLoader(self.data, batch_size=batch, sampler=sampler, num_workers=self.workers,
                                           pin_memory=self.pin, drop_last=drop_last, generator=generator,
                                           multiprocessing_context=context)

    def _read(self, loader):
        it = iter(loader)
        count = 0
        while True:
            try:
                item = next(it)
            except StopIteration:
                return
            except Exception as e:  # noqa: BLE001  (the Dataset's __getitem__, in this process or a worker)
                readers = "%d loader worker%s" % (self.workers, "s" if self.workers != 1 else "") if self.workers \
                    else "no loader workers"
                raise UserCodeError("the %s Dataset (data(rank, world)'s %s, read by a DataLoader with %s)"
                                    % (self.part, self.part, readers), self.path, e) from e
            count += 1
            yield self._batch(item, "batch %d" % count)

    def batches(self, order, batch, steps, generator=None):
        # The generator seeds the workers' random streams (a random crop in the Dataset), so an epoch's are fixed by
        # (seed, epoch, rank) as its order is.
        return self._read(self._loader(batch, sampler=order[:steps * batch].tolist(), generator=generator,
                                       drop_last=True))

    def in_order(self, batch):
        # A generator of its own: DataLoader draws its workers' base seed from torch's global one otherwise, and an
        # evaluation would move the random stream of the training steps after it (dropout), as tensors' does not.
        return self._read(self._loader(batch, generator=torch.Generator().manual_seed(0)))


def _class_indices(labels):
    """Whether `labels` (a tensor) are of a dtype that holds class indices: an integer one, not bool."""
    return not (labels.dtype.is_floating_point or labels.dtype.is_complex or labels.dtype == torch.bool)


# cross_entropy's ignore_index: the label of a position no loss or accuracy counts (a sequence's padding).
_IGNORED_LABEL = -100


def _check_label_range(where, what, labels, classes):
    """Labels must index the model's class scores; -100 is cross_entropy's ignore_index (a sequence's padding)."""
    labels = labels[labels != _IGNORED_LABEL]
    if labels.numel() == 0:
        return
    lo, hi = int(labels.min()), int(labels.max())
    if lo < 0 or hi >= classes:
        raise WorkloadError("%s: %s holds labels %d..%d, but the model's forward gives %d class scores an example "
                            "(labels 0..%d)" % (where, what, lo, hi, classes, classes - 1))


def user_data(spec, user, rank, world, device):
    """data(rank, world) of the user's module, checked: (train, test), each either a pair of tensors (x, y) with the
    examples along dimension 0 and integer class labels (cross_entropy's targets), or a map-style
    torch.utils.data.Dataset of (x, y) items (read through a DataLoader, DatasetExamples); else WorkloadError saying
    what came back. Labels of another integer type become int64, as torch's loss needs. Returns the two as
    TensorExamples or DatasetExamples."""
    path = spec.pt["module"]
    try:
        result = user.data(rank, world)
    except Exception as e:  # noqa: BLE001
        raise UserCodeError("data(%d, %d)" % (rank, world), path, e) from e
    where = "workload.pytorch.module: data(%d, %d) in %s" % (rank, world, path)
    Dataset = torch.utils.data.Dataset

    def pair(value):
        return isinstance(value, (tuple, list)) and len(value) == 2

    if not pair(result) or not all(pair(part) or isinstance(part, Dataset) for part in result):
        raise WorkloadError("%s returned %s; expected ((train_x, train_y), (test_x, test_y)), this rank's training "
                            "examples and the test set, or a torch.utils.data.Dataset of (x, y) items in place of "
                            "either pair" % (where, _describe(result)))
    out = []
    for part, value in zip(("train", "test"), result):
        if isinstance(value, Dataset):
            if isinstance(value, torch.utils.data.IterableDataset) or not hasattr(type(value), "__len__"):
                raise WorkloadError("%s: the %s set is %s, %s; the driver needs a map-style Dataset (__len__ and "
                                    "__getitem__): it counts every rank's steps from the length and draws the order "
                                    "of each epoch itself" % (where, part, _describe(value),
                                                              "an IterableDataset" if isinstance(
                                                                  value, torch.utils.data.IterableDataset)
                                                              else "which has no __len__"))
            try:
                n = len(value)
            except Exception as e:  # noqa: BLE001  (the module's own __len__)
                raise UserCodeError("len() of the %s Dataset" % part, path, e) from e
            if n == 0:
                raise WorkloadError("%s: the %s Dataset (%s) is empty; expected at least one example"
                                    % (where, part, _describe(value)))
            out.append(DatasetExamples(value, part, where, path, spec.loader_workers, device.type == "cuda"))
            continue
        x, y = value
        for name, v in (("x", x), ("y", y)):
            if not isinstance(v, torch.Tensor) or v.dim() == 0:
                numpy = type(v).__module__ == "numpy"
                raise WorkloadError("%s: %s_%s is %s, not a tensor with the examples along dimension 0%s"
                                    % (where, part, name, _describe(v), " (torch.from_numpy converts)" if numpy
                                       else ""))
        if len(x) != len(y) or len(y) == 0:
            raise WorkloadError("%s: %s_x holds %d examples and %s_y %d labels; expected as many, at least one"
                                % (where, part, len(x), part, len(y)))
        if not _class_indices(y):
            raise WorkloadError("%s: %s_y is %s; labels are class indices, of an integer dtype such as torch.long "
                                "(y.long() converts whole numbers)" % (where, part, str(y.dtype).replace("torch.", "")))
        out.append(TensorExamples(x, y.long()))
    if spec.loader_workers and not any(o.dataset for o in out):
        raise WorkloadError("workload.pytorch.loader_workers: %d, but %s returned tensors, which each rank indexes in "
                            "its own process; the field is for a module whose data() returns Datasets (or leave it "
                            "out)" % (spec.loader_workers, where))
    return out


_GLOO_DTYPES = {}  # dtype -> whether this torch's gloo carries it (_gloo_carries)
_GLOO_PROBE = []  # the one-rank group _gloo_carries asks, made once


def _gloo_carries(dtype):
    """Whether gloo can broadcast and allreduce `dtype`: asked of a one-rank gloo group of this process, since which
    dtypes gloo takes depends on the torch build (1.13's refuses bfloat16 and bool with "Invalid scalar type")."""
    if dtype not in _GLOO_DTYPES:
        # The group and the probe's tensor live as long as the process: a group destroyed here, with the GIL held,
        # joins gloo's thread, which may still wait for the GIL to drop the last reference to the tensor (a hang), and
        # a tensor freed on gloo's thread at the process's end aborts it (terse.torch._held_past_gloo).
        if not _GLOO_PROBE:
            _GLOO_PROBE.append(dist.ProcessGroupGloo(dist.HashStore(), 0, 1, timedelta(seconds=10)))
        probe = torch.zeros(1, dtype=dtype)
        terse.torch._keep_past_gloo(probe)
        try:
            _GLOO_PROBE[0].broadcast([probe]).wait()
            _GLOO_DTYPES[dtype] = True
        except RuntimeError:
            _GLOO_DTYPES[dtype] = False
    return _GLOO_DTYPES[dtype]


def _dtype(t):
    return str(t.dtype).replace("torch.", "")


def _first_layer(model):
    """ " (its first layer, fc (Linear), takes 32 input features)", or "" when the model says nothing of its input."""
    for name, m in model.named_modules():
        for attr, what in (("in_features", "input features"), ("in_channels", "input channels")):
            if isinstance(getattr(m, attr, None), int):
                return " (its first layer, %s (%s), takes %d %s)" % (name or "the model", type(m).__name__,
                                                                    getattr(m, attr), what)
    return ""


def check_fit(spec, model, data, device, rank, world, loss=None):
    """Trains one batch of this rank's data on the bare model, before any process group, and checks what a mismatch
    of data() and model() would otherwise fail inside torch with, in every rank and every variant, as a traceback of
    torch's frames: a dtype gloo cannot broadcast (DDP's first collective), inputs the forward cannot take (dtype,
    features), scores that do not fit the labels, a loss() that returns no scalar tensor with grad, a parameter the
    forward leaves unused without find_unused_parameters (DDP's "Expected to have finished reduction" in the second
    step). `loss` is the module's loss(output, labels), None for cross-entropy. Raises WorkloadError naming data() and
    model() (or loss()) and what does not fit; UserCodeError when the forward or loss() fails in the module's own code.
    The model comes back as it was: its gradients unset, its buffers (batch norm's statistics) and the random state
    untouched -- torch's generators, Python's `random` and numpy's global generator (when numpy is imported), so a run
    trains as it would without the check. What the model keeps in its own Python attributes (a count of its forwards,
    a cache) cannot be restored in general: such a model sees one forward more than its training steps."""
    path = spec.pt["module"]
    fn = "workload.pytorch.module: model() and data(%d, %d) in %s" % (rank, world, path)
    train, test = data
    if device.type == "cpu":
        for kind, named in (("parameter", model.named_parameters()), ("buffer", model.named_buffers())):
            for name, t in named:
                if not _gloo_carries(t.dtype):
                    raise WorkloadError('workload.pytorch.module: model() in %s has %s %s of dtype %s, which DDP '
                                        'broadcasts and the gloo of torch %s (device "cpu") cannot carry; convert the '
                                        'model (model.float()), or train on device "cuda" (NCCL)'
                                        % (path, kind, name, _dtype(t), torch.__version__))
    n = min(spec.batch, len(train))
    first = "the train Dataset's first %d items" % n if train.dataset else "train_x[:%d]" % n
    floats = sorted({_dtype(p) for p in model.parameters() if p.is_floating_point()})
    buffers = [(b, b.detach().clone()) for b in model.buffers()]
    skipped = False
    # A forward, and a Dataset's items (a random crop in its transform), may draw from Python's and numpy's global
    # generators too: training's first step must see them as they were. numpy only when something imported it: its
    # state cannot have changed otherwise (but for a Dataset that imports numpy in its first __getitem__ and draws).
    py_random = random.getstate()
    numpy = sys.modules.get("numpy")
    np_random = numpy.random.get_state() if numpy is not None else None
    try:
        with torch.random.fork_rng(devices=[]):
            x, y = train.head(n)
    except BaseException:
        random.setstate(py_random)
        if np_random is not None:
            numpy.random.set_state(np_random)
        raise
    x, y = x.to(device), y.to(device)
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        try:
            out = model(x)
            if not isinstance(out, torch.Tensor) or out.dim() == 0 or not out.is_floating_point():
                raise WorkloadError("%s: the model's forward on %s returns %s; the driver trains on a "
                                    "floating-point tensor of class scores, the classes along the last dimension"
                                    % (fn, first, _describe(out)))
            classes = out.shape[-1]
            if out.numel() // max(1, classes) != y.numel():
                raise WorkloadError("%s: the model's forward on %s (%s) gives %s, %d rows of %d class "
                                    "scores, for %s: one row a label is expected"
                                    % (fn, first, _describe(x), _describe(out), out.numel() // max(1, classes), classes,
                                       _describe(y)))
            # Tensors' labels all at once; a Dataset's as its batches come (DatasetExamples), from the first on.
            for part, examples in (("train", train), ("test", test)):
                labels = examples.labels()
                if labels is not None:
                    _check_label_range(fn, part + "_y", labels, classes)
                else:
                    examples.classes = classes
            if train.dataset:
                _check_label_range(fn, first, y.cpu(), classes)
            if loss is None:
                F.cross_entropy(out.reshape(-1, classes), y.reshape(-1)).backward()
            else:
                try:
                    value = loss(out, y)
                except Exception as e:  # noqa: BLE001  (the module's own code)
                    raise UserCodeError("loss(output, labels) on the forward of %s of data(%d, %d)"
                                        % (first, rank, world), path, e) from e
                scalar = isinstance(value, torch.Tensor) and value.dim() == 0
                if not (scalar and value.is_floating_point() and value.requires_grad):
                    got = _describe(value)
                    if scalar and not value.requires_grad:
                        got += " without grad (computed apart from output, or detached)"
                    raise WorkloadError("workload.pytorch.module: loss(output, labels) in %s returned %s on the "
                                        "model's forward of %s (output %s, labels %s); the driver trains on "
                                        "a scalar floating-point tensor computed from output: the batch's mean "
                                        "(reduce a per-example loss with .mean(); the test loss weights it by the "
                                        "batch's labels)" % (path, got, first, _describe(out), _describe(y)))
                value.backward()
        except (WorkloadError, UserCodeError):
            raise
        except Exception as e:  # noqa: BLE001
            frames = traceback.extract_tb(e.__traceback__)
            distributed = os.sep + os.path.join("torch", "distributed") + os.sep
            if any(distributed in f.filename for f in frames) or "process group" in str(e):
                # The forward uses torch.distributed (SyncBatchNorm, a contrastive loss's all_gather), which needs the
                # process group this check runs before: no misfit of data() and model(), so training decides.
                _say("terse.train: rank %d: the check forward of model() on data() is skipped: the model's forward "
                     "uses torch.distributed (%s: %s)" % (rank, type(e).__name__, _message(e)))
                skipped = True
            else:
                # The innermost frame outside torch and the installed packages: in the user's own files (the
                # module's folder) the fault is their code's -- a layer wired to the wrong size inside their forward,
                # say -- and they get its traceback; in this driver (an nn.Sequential handed inputs it cannot take),
                # what does not fit, in one line.
                torch_dir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
                own = [f for f in frames if not os.path.abspath(f.filename).startswith(torch_dir)
                       and "-packages" + os.sep not in f.filename]
                if own and os.path.abspath(own[-1].filename).startswith(os.path.dirname(os.path.abspath(path))
                                                                        + os.sep):
                    raise UserCodeError("the model's forward on %s of data(%d, %d)" % (first, rank, world),
                                        path, e) from e
                hint = ""
                if x.is_floating_point() and floats and floats != [_dtype(x)]:
                    hint = "; train_x is %s, the model's parameters %s (x.to(%s) converts)" % (
                        _dtype(x), " and ".join(floats), "torch." + floats[0])
                raise WorkloadError("%s do not fit: the model's forward on %s (%s) raised %s: %s%s%s"
                                    % (fn, first, _describe(x), type(e).__name__, _message(e), _first_layer(model),
                                       hint)) from None
        finally:
            for b, kept in buffers:
                b.data.copy_(kept)
            random.setstate(py_random)
            if np_random is not None:
                numpy.random.set_state(np_random)
    unused = [name for name, p in model.named_parameters() if p.requires_grad and p.grad is None]
    model.zero_grad(set_to_none=True)
    if skipped:
        return
    if unused and not spec.find_unused:
        listed = ", ".join(unused[:5]) + (" and %d more" % (len(unused) - 5) if len(unused) > 5 else "")
        them = "them" if len(unused) > 1 else "it"
        raise WorkloadError("%s: the model's forward on %s leaves parameter%s %s unused, which DDP fails on "
                            "after the first step; set workload.pytorch.find_unused_parameters: true where a step may "
                            "skip them, else use %s in forward, drop %s, or freeze %s (requires_grad=False)"
                            % (fn, first, "s" if len(unused) > 1 else "", listed, them, them, them))


class ImageData:
    """A torchvision model's inputs: Fashion-MNIST (28x28 grey, resized per batch) or synthetic images."""

    def __init__(self, spec):
        self.size = int(spec.pt["image_size"])
        self.channels = int(spec.pt["channels"])
        if spec.pt.get("data", "FASHION_MNIST") == "SYNTHETIC":
            g = torch.Generator().manual_seed(spec.seed)
            n = int(spec.pt["synthetic_examples"])
            n_test = max(1, n // 10)
            shape = (self.channels, self.size, self.size)
            classes = int(spec.pt["num_classes"])
            self.train_x = torch.randn((n,) + shape, generator=g)
            self.train_y = torch.randint(0, classes, (n,), generator=g)
            self.test_x = torch.randn((n_test,) + shape, generator=g)
            self.test_y = torch.randint(0, classes, (n_test,), generator=g)
            self.resize = False
        else:
            (tx, ty), (vx, vy) = spec.recipe.data()
            self.train_x = torch.from_numpy(tx).reshape(-1, 1, 28, 28)
            self.train_y = torch.from_numpy(ty).long()
            self.test_x = torch.from_numpy(vx).reshape(-1, 1, 28, 28)
            self.test_y = torch.from_numpy(vy).long()
            self.resize = True
        # Every rank holds the whole training set and draws from its own shard of it (shard()).

    def inputs(self, x):
        if self.resize:
            if self.size != 28:
                x = F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)
            if self.channels != 1:
                x = x.expand(-1, self.channels, -1, -1)
        return x


def epoch_order(spec, own, rank, world, epoch, generator):
    """The examples this rank trains on in `epoch`, in order. IID: its equal share `own` of the training set in a
    new order each epoch, drawn from `generator` (the epoch's, seeded by the run's seed, the epoch and the rank).
    data.partition DIRICHLET: its fixed non-IID shard in the native sampler's order, the sampler's batches one after
    the other (terse.Recipe draws them as the runner does); `own` and `generator` aside."""
    if spec.partitioned:
        return torch.from_numpy(numpy.concatenate(spec.recipe.batches(rank, world, epoch))).long()
    return own[torch.randperm(len(own), generator=generator)]


def replicas_agree(params, world, device, state=None):
    """Whether every rank's `params` (those local SGD averages) are bit for bit rank 0's (one all_gather of a
    checksum): local SGD's evaluation points check it, as the native runner does. With `state` (the run's
    CompressionState), its step trace leaves the check out of the step's time."""
    h = hashlib.sha256()
    for p in params:
        h.update(p.detach().reshape(-1).cpu().contiguous().view(torch.uint8).numpy())
    mine = torch.tensor([int.from_bytes(h.digest()[:8], "little", signed=True)], dtype=torch.int64, device=device)
    every = [torch.empty_like(mine) for _ in range(world)]
    with state._aside() if state is not None else contextlib.nullcontext():
        dist.all_gather(every, mine)
    terse.torch._keep_past_gloo(mine, *every)
    return all(int(t.item()) == int(mine.item()) for t in every)


def shard(n, rank, world):
    """This rank's example indices: an equal share of n (the remainder is left out so every shard is as long)."""
    per = n // world
    return torch.arange(rank * per, (rank + 1) * per)


# ---- one rank


_GROUP_JOINING = False  # init_group was called: a failure from here on is not one "before training"
_TRAINING = False  # transport TCP: every rank agreed that none failed before training (_agree_before_training)


def init_group(spec, rank, world, store_path, backend=None):
    """Joins the job's process group: NCCL for device "cuda", else gloo. `backend` "gloo" for a rank that failed before
    training and only joins to tell its peers (_run_rank): one with no GPU cannot make an NCCL group, and the agreement
    goes over a gloo group of its own anyway."""
    global _GROUP_JOINING
    _GROUP_JOINING = True
    backend = backend or ("nccl" if spec.device == "cuda" else "gloo")
    timeout = timedelta(seconds=spec.timeout_s)
    if store_path is not None:
        dist.init_process_group(backend, init_method="file://" + store_path, rank=rank, world_size=world,
                                timeout=timeout)
    elif all(k in os.environ for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")):
        dist.init_process_group(backend, init_method="env://", timeout=timeout)
    else:
        addr = os.environ["TERSE_MASTER_ADDR"]
        port = int(os.environ["TERSE_MASTER_PORT"]) + 1
        dist.init_process_group(backend, init_method="tcp://%s:%d" % (addr, port), rank=rank, world_size=world,
                                timeout=timeout)


# What a rank that failed before training tells its peers (_agree_before_training): the kind terse run reads in the
# error file (_write_error), "config" or "module" for a refusal of the workload, "" for any other failure.
_BEFORE_TRAINING_KINDS = ("", "module", "config")


def _kind(error):
    agreed = getattr(error, "terse_agreed_kind", None)  # set by _agree_before_training
    if agreed is not None:
        return agreed
    if _TRAINING:
        # A refusal once training started (DDP's unfinished reduction, which the driver turns into a WorkloadError
        # naming find_unused_parameters) comes on the rank whose step skipped parameters, while its peers fail with a
        # broken collective: a kind on that rank alone would have its terse run skip variants the others run, and
        # wait for it in each until the timeout. A failure of this variant alone, on every rank.
        return ""
    if isinstance(error, PeerRefused):
        return error.kind
    return "config" if isinstance(error, WorkloadError) else "module" if isinstance(error, UserCodeError) else ""


def _device(spec, rank):
    if spec.device == "cuda":
        if torch.cuda.device_count() == 0:  # check_workload says so first; a driver started by hand may not have run it
            raise WorkloadError('workload.pytorch.device: "cuda", but this rank sees no CUDA device')
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def _agree_before_training(spec, rank, world, error):
    """Transport TCP, once every rank has joined the process group: whether any rank failed before it (its checks, its
    module's model() or data(), the check forward). Every rank then fails -- the failing ones with their own error, the
    others with the lowest failing rank's reason (PeerRefused) -- and every rank with the lowest failing rank's kind,
    so that each rank's terse run fails the variant alike and skips the same later variants (a rank that skipped
    variants its peers ran would wait for them in each until the timeout). Without it the healthy ranks waited in
    init_process_group for the timeout, and only the failing rank's terse run skipped the variants after.
    Over gloo on CPU tensors also with device "cuda": a rank may have failed for want of its GPU (none visible, out of
    memory), and it must still be able to say so. In process (mp.spawn) none of this is needed: one driver speaks for
    every rank and ends them all."""
    group = dist.new_group(backend="gloo") if spec.device == "cuda" else None
    summary = b"" if error is None else _summary_line(error).encode("utf-8", "replace")[:4096]
    code = 0 if error is None else 1 + _BEFORE_TRAINING_KINDS.index(_kind(error))
    got = [t.tolist() for t in _all_gather(torch.tensor([code, len(summary)], dtype=torch.int64), world, group)]
    failed = [r for r, (c, _) in enumerate(got) if c != 0]
    if not failed:
        return
    longest = max(min(max(n, 0), 4096) for _, n in got)
    padded = torch.tensor(list(summary) + [0] * (longest - len(summary)), dtype=torch.uint8)
    texts = _all_gather(padded, world, group)
    first = failed[0]
    code, n = got[first]
    kind = _BEFORE_TRAINING_KINDS[code - 1] if 1 <= code <= len(_BEFORE_TRAINING_KINDS) else ""
    if error is not None:
        error.terse_agreed_kind = kind
        raise error
    text = bytes(texts[first].tolist()[:min(max(n, 0), longest)]).decode("utf-8", "replace")
    raise PeerRefused(first, text, kind)


# This rank raises right after the gathers: their tensors are held past gloo (terse.torch._held_past_gloo says why).
_all_gather = terse.torch._all_gather_held


def evaluate(model, test, prepare, device, loss, batch=256):
    """Test accuracy and loss over the labels other than -100 (cross_entropy's ignore_index, the usual label of a
    sequence's padding, which training's loss leaves out too): padding counted as a wrong prediction would understate
    a sequence model's accuracy by its share of padding. A module's loss() gives a batch's mean (as training takes it),
    so its test loss is the mean over the batches weighted by their labels that count; cross-entropy sums over them."""
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for x, y in test.in_order(batch):
            x = prepare(x).to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            logits = model(x)
            counted = y != _IGNORED_LABEL
            n = int(counted.sum())
            if loss is not _cross_entropy and n > 0:
                loss_sum += float(loss(logits, y)) * n
            logits, y, counted = logits.reshape(-1, logits.shape[-1]), y.reshape(-1), counted.reshape(-1)
            if loss is _cross_entropy:
                loss_sum += F.cross_entropy(logits, y, reduction="sum", ignore_index=_IGNORED_LABEL).item()
            correct += ((logits.argmax(dim=1) == y) & counted).sum().item()
            total += n
    model.train()
    return correct / max(1, total), loss_sum / max(1, total)


# The start of what DDP raises at the forward after a step whose gradients were not all reduced (torch 1.13 and 2.x).
_UNFINISHED_REDUCTION = "Expected to have finished reduction in the prior iteration"


def make_optimizer(spec, parameters, lr):
    """torch.optim's optimizer of the optimizer block's kind. The learning rate is set again before every step, from
    terse's schedule (terse.Recipe.learning_rate), whatever the kind."""
    if spec.optimizer == "SGD":
        return torch.optim.SGD(parameters, lr=lr, momentum=spec.momentum, nesterov=spec.nesterov,
                               weight_decay=spec.weight_decay)
    kinds = {"ADAM": torch.optim.Adam, "ADAMW": torch.optim.AdamW}
    if spec.optimizer not in kinds:
        raise terse.InvalidArgument("optimizer.kind: %r is not SGD, ADAM or ADAMW" % spec.optimizer)
    return kinds[spec.optimizer](parameters, lr=lr, betas=spec.betas, eps=spec.eps, weight_decay=spec.weight_decay)


def train_rank(rank, world, spec, store_path):
    global _TRAINING
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    logger = None
    state = None
    try:
        # The model and the data before the process group: a module that fails them fails this rank with its own
        # error at once, rather than after the others have joined.
        device = _device(spec, rank)
        if spec.device == "cuda":
            torch.cuda.set_device(device)
        torch.manual_seed(spec.seed)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
        user = _load_module(spec.pt["module"]) if "module" in spec.pt else None
        model = build_model(spec, user).to(device)
        loss_fn = loss_function(user)
        if user is not None:
            train, test = user_data(spec, user, rank, world, device)
            check_fit(spec, model, (train, test), device, rank, world,
                      loss=None if loss_fn is _cross_entropy else loss_fn)
            prepare = lambda x: x  # noqa: E731
            own = torch.arange(len(train))
        else:
            images = ImageData(spec)
            train = TensorExamples(images.train_x, images.train_y)
            test = TensorExamples(images.test_x, images.test_y)
            prepare = images.inputs
            own = shard(len(train), rank, world)
            if spec.partitioned:
                own = epoch_order(spec, own, rank, world, 0, None)  # its non-IID shard: the step count follows it
            # Fashion-MNIST's ten classes for a model of fewer: cross_entropy's "Target 9 is out of bounds" otherwise.
            top = int(max(train.y.max(), test.y.max()))
            if top >= int(spec.pt["num_classes"]):
                raise WorkloadError("workload.pytorch.num_classes: %s, but the data's labels run up to %d"
                                    % (spec.pt["num_classes"], top))
        init_group(spec, rank, world, store_path)
        if spec.multi_process:
            _agree_before_training(spec, rank, world, None)
            _TRAINING = True
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index is not None
                                                        else None, find_unused_parameters=spec.find_unused)
        # The wrapper, when DDP finds unused parameters, tells the state so: it then issues its collectives on a group
        # of its own, apart from DDP's all_reduce of the used-parameter map (terse/torch.py, _group_of_its_own).
        state = terse.torch.CompressionState(
            spec.compressor, params=spec.params, error_feedback=spec.error_feedback,
            error_feedback_rule=spec.error_feedback_rule, ef21_momentum=spec.ef21_momentum,
            compression_start_step=spec.compression_start_step, momentum_correction=spec.mc,
            momentum_masking=spec.mc_masking, momentum_nesterov=spec.mc_nesterov,
            module=ddp if spec.find_unused else model, seed=spec.seed, plugin_path=spec.args.plugin_path,
            plugin_timeout=spec.plugin_timeout_s, step_trace=spec.step_trace)
        # With local_sgd, the native schedule (core/train/sync_trainer.h, "Local SGD") through a LocalSGD on the DDP
        # wrapper, whose buffer broadcast it turns off for the local steps; the models are also averaged at the
        # evaluation points (below).
        local = terse.local_sgd.register(ddp, state, spec.local_sgd)
        # A repeat's folder is <variant>/seed-N (experiments::resultsSubfolder): the logger writes it from the seed.
        variant, _, repeat = spec.args.folder.partition("/")
        logger = terse.torch.ResultsLogger(spec.args.out, study=spec.study, variant=variant,
                                           state=state if local is None else local, description=spec.text,
                                           seed=spec.seed if repeat else None,
                                           data_partition=spec.recipe.data_partition(world) if spec.partitioned
                                           else ())
        # Every rank takes the same number of steps: the smallest shard's.
        # On the model's device: NCCL (device "cuda") carries CUDA tensors only.
        steps = torch.tensor([len(own) // spec.batch], dtype=torch.int64, device=device)
        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
        terse.torch._keep_past_gloo(steps)  # a refusal below ends the process at once (_held_past_gloo says why)
        per_epoch = int(steps.item())
        if spec.max_steps > 0:
            per_epoch = min(per_epoch, spec.max_steps)
        if per_epoch < 1:
            raise WorkloadError("data.batch_size: %d examples per step, but a rank's shard holds %d"
                                % (spec.batch, len(own)))
        opt = make_optimizer(spec, model.parameters(), spec.recipe.learning_rate(0, world, per_epoch))
        if local is not None:
            local.optimizer = opt  # the quadratic synchronization rule reads the rate the loop sets each step
        total = per_epoch * spec.epochs
        if rank == 0:
            warnings = [spec.recipe.compression_start_warning(total),
                        spec.recipe.compressor_phases_warning(state._agg.phase_steps, total)]
            if local is not None:
                warnings.append(spec.recipe.local_sgd_warning(per_epoch, total, world))
            for warning in filter(None, warnings):
                print("warning: [%s] %s" % (variant, warning), file=sys.stderr, flush=True)
        step, loss_since, steps_since, start = 0, 0.0, 0, time.perf_counter()
        for epoch in range(spec.epochs):
            g = torch.Generator().manual_seed(spec.seed * 1000003 + epoch * 1009 + rank)
            order = epoch_order(spec, own, rank, world, epoch, g)
            for x, y in train.batches(order, spec.batch, per_epoch, generator=g):
                x = prepare(x).to(device, non_blocking=True)
                y = y.to(device, non_blocking=True)
                lr = spec.recipe.learning_rate(step, world, per_epoch)
                for group in opt.param_groups:
                    group["lr"] = lr
                opt.zero_grad(set_to_none=False)
                loss = loss_fn(ddp(x), y)
                loss.backward()
                if spec.clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip)
                opt.step()
                step += 1
                loss_since += loss.item()
                steps_since += 1
                evaluates = (spec.every_steps and step % spec.every_steps == 0) or \
                    (spec.per_epoch and step % per_epoch == 0) or step == total
                if local is not None:
                    local.step(average=bool(evaluates))  # every rank evaluates the one averaged model
                if evaluates:
                    if local is not None and local.local and not replicas_agree(local.parameters, world, device,
                                                                                state):
                        raise terse.InternalError("local SGD: the replicas differ at step %d, an evaluation point, "
                                                  "where they were averaged" % step)
                    accuracy, test_loss = evaluate(model, test, prepare, device, loss_fn)
                    logger.record(test_accuracy=accuracy, test_loss=test_loss, test_examples=len(test),
                                  train_loss=loss_since / steps_since, epoch=step / per_epoch, lr=lr)
                    if rank == 0:
                        print("%s step %d/%d epoch %.2f: test accuracy %.4f, loss %.4f, payload %d B, %.1f s"
                              % (spec.args.folder, step, total, step / per_epoch, accuracy, test_loss,
                                 state.totals()["payload"], time.perf_counter() - start), flush=True)
                    loss_since, steps_since = 0.0, 0
        state.close()
        logger.finish()
        # Every rank is past its last collective before any of them leaves (see _leave).
        dist.barrier()
    except BaseException as e:
        # Out of backward, autograd wraps the hook's error in a RuntimeError whose text ends in the callback's
        # traceback; terse's own exception, kept by the state, is the one worth reporting.
        if state is not None and state.error is not None and e is not state.error:
            e = state.error
        elif not spec.find_unused and _UNFINISHED_REDUCTION in str(e):
            # A step that left parameters without a gradient, which check_fit's one forward did not (a branch taken by
            # the data or the step): torch's message names its own keyword and a page of causes.
            e = WorkloadError("workload.pytorch.find_unused_parameters: a step of the model left parameters without a "
                              "gradient, so DDP's reduction of the step never finished (torch: %s); set "
                              "find_unused_parameters: true in the pytorch block where a step may skip parameters"
                              % _UNFINISHED_REDUCTION)
        if logger is not None:
            logger.finish(error=_summary(e))
        raise e


def _write_error(error_file, summary, error):
    """The file terse run reads when the driver fails (experiments/runner/pytorch_runner.cc): the summary line, then
    "config" when the driver's own checks refused the workload (WorkloadError), "module" when the user's module
    failed in importing, model(), data() or the check forward (UserCodeError), which fail alike in every variant:
    terse run takes either as an error of every variant with that workload rather than of this one. The first
    failing rank's; later ones leave it."""
    if not error_file:
        return
    kind = _kind(error) + "\n" if _kind(error) else ""
    try:
        with open(error_file, "x") as f:
            f.write(summary + "\n" + kind)
    except FileExistsError:
        pass


def _report(prefix, e):
    """Prints a failure for the reader of terse run's output and returns its one-line summary. terse's own errors
    (the driver's checks, the hook's) are one line: their message names the field or the plugin. An exception of the
    user's module gets its traceback from the user's first frame on (the driver's and importlib's frames say nothing
    to its author); anything else its whole traceback."""
    if isinstance(e, UserCodeError):
        frames = traceback.extract_tb(e.error.__traceback__)
        driver = os.path.abspath(__file__)
        while len(frames) > 1 and (os.path.abspath(frames[0].filename) == driver
                                   or frames[0].filename.startswith("<frozen")):
            frames.pop(0)
        text = "".join(traceback.format_list(frames)) + "".join(traceback.format_exception_only(type(e.error),
                                                                                                 e.error))
        _say("terse.train: %s%s\nTraceback (most recent call last):\n%s" % (prefix, _summary_line(e), text))
        return prefix + _summary_line(e)
    summary = prefix + _summary(e)
    if isinstance(e, terse.Error) or _interrupted(e):  # Ctrl-C inside backward comes as torch's RuntimeError
        _say("terse.train: %s" % summary)
    else:
        _say("".join(traceback.format_exception(type(e), e, e.__traceback__)))
    return summary


def _summary_line(e):
    """_summary, and for the user's module's own exception the field it is about."""
    return "workload.pytorch.module: %s" % e if isinstance(e, UserCodeError) else _summary(e)


def _summary(e):
    """An exception in the one line terse run and status.json keep. A WorkloadError's message starts with the field it
    is about; the class name would only be noise."""
    if _interrupted(e):
        return "interrupted"
    return ("" if isinstance(e, (WorkloadError, PeerRefused)) else type(e).__name__ + ": ") + _message(e)


def _interrupted(e):
    # Ctrl-C inside the hook reaches backward's caller as torch's RuntimeError "KeyboardInterrupt: <EMPTY MESSAGE>".
    return isinstance(e, KeyboardInterrupt) or str(e).lstrip().startswith("KeyboardInterrupt")


# What torch appends to an error out of C++ code (a Future's, a hook's): "\n\nAt:\n" and the Python frames.
_TORCH_FRAMES = re.compile(r"\n\s*At:\s*\n")


def _message(e):
    """The informative line of an exception's message (str(e) when that is all there is): torch's appended frame list
    is cut; of a traceback's text (what torch's RuntimeError out of a hook's Future carries, a rank's
    ProcessRaisedException) the exception line of its last traceback; else the first line, with the next when it
    ends in a colon. The last line, as before, was often torch's frame list or an afterthought ("In addition, you can
    set the environment variable TORCH_DISTRIBUTED_DEBUG ...")."""
    text = _TORCH_FRAMES.split(str(e), maxsplit=1)[0]
    lines = text.splitlines()
    # "Original Traceback ...": a DataLoader worker's, re-raised in the rank.
    heads = [i for i, line in enumerate(lines) if line.strip().endswith("Traceback (most recent call last):")]
    if heads:
        # Frames are indented; the exception's line is the first one that is not.
        body = [line for line in lines[heads[-1] + 1:] if line.strip() and not line[:1].isspace()]
        if body:
            return body[0].strip()
    lines = [line.strip() for line in lines if line.strip()]
    if not lines:
        return str(e).strip()
    if lines[0].endswith(":") and len(lines) > 1:
        return lines[0] + " " + lines[1]
    return lines[0]


def _say(text):
    """Writes a message to stderr in one write, ending in a newline: the ranks share the stream, and a message
    written in pieces (print's text, then its newline) runs into another rank's."""
    if not text.endswith("\n"):
        text += "\n"
    sys.stderr.flush()
    data = text.encode("utf-8", "replace")
    while data:
        data = data[os.write(2, data):]


def _leave(code, error_file=None, summary=None, error=None):
    """Ends a rank's process at once, without the interpreter's teardown. Tearing down a gloo process group joins
    gloo's worker threads while holding the GIL, and a worker dropping the last reference to a tensor made in Python
    needs the GIL: torch 1.13 can hang there (seen at the end of runs of this driver). Everything worth keeping is
    written by now: metrics are flushed per record, the status is written atomically, and the error summary goes to
    the file terse run reads (_write_error)."""
    if summary is not None:
        _write_error(error_file, summary, error)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_rank(rank, world, spec, store_path, error_file, early=None):
    """early: the failure of this rank's check_workload (transport TCP), reported as train_rank's would be."""
    # A fatal signal (a crashing plugin) names the rank and the plugin call on stderr and in the error file, which
    # terse run turns into the status (core/common/crash.h); the process still dies of the signal.
    terse._terse.install_crash_handler(rank, error_file or "")
    try:
        if early is not None:
            raise early
        train_rank(rank, world, spec, store_path)
    except BaseException as e:  # noqa: BLE001  (reported to terse run, then the process ends)
        if spec.multi_process and isinstance(e, Exception) and not _GROUP_JOINING:
            # Failed before the process group: join it to tell the peers waiting there (_agree_before_training).
            try:
                init_group(spec, rank, world, store_path, backend="gloo")
                _agree_before_training(spec, rank, world, e)
            except Exception:  # noqa: BLE001  (this rank's own error, raised back, or no peers to tell)
                pass
        _leave(1, error_file, _report("" if isinstance(e, PeerRefused) else "rank %d: " % rank, e), e)
    _leave(0)


def _end_ranks(grace_s=5.0):
    """The ranks mp.spawn started, given grace_s to leave by themselves (after a Ctrl-C from a terminal they heard it
    too, and record it), then terminated: a SIGINT sent to terse run alone reaches this process only, and Python would
    wait for the ranks at exit while they train on (until terse run killed everything, 20 s later)."""
    deadline = time.monotonic() + grace_s
    for p in mp.active_children():
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.terminate()
            p.join(5.0)


def _end_with_parent(parent):
    """SIGTERM when the process that started this one ends (Linux's PR_SET_PDEATHSIG), so that a rank never trains on
    after its driver is gone (terse run stopped by its user: the driver ends with it, pytorch_runner.cc); the check
    after the call catches a parent gone before it."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM), 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return  # no prctl to call: the rank ends as before, when its collectives fail
    if os.getppid() != parent:
        os._exit(128 + int(signal.SIGTERM))


def _spawned(rank, world, args, store_path, parent):
    _end_with_parent(parent)
    # Each process loads the experiment itself: a terse.Recipe does not cross a process boundary.
    try:
        spec = Spec(args)
    except BaseException as e:  # noqa: BLE001
        _leave(1, args.error_file, _report("rank %d: " % rank, e), e)
    _run_rank(rank, world, spec, store_path, args.error_file)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m terse.train", description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", help="one resolved variant, in terse's text format")
    p.add_argument("--out", required=True, help="the results root")
    p.add_argument("--folder", required=True, help="the variant's results folder name")
    p.add_argument("--plugin-path", action="append", default=[], help="search DIR for plugins (repeatable)")
    p.add_argument("--error-file", help="on failure, write the error's one-line summary here (for terse run)")
    args = p.parse_args(argv)
    error = None
    try:
        spec = Spec(args)
        if spec.multi_process:
            rank = int(os.environ.get("RANK", os.environ.get("TERSE_RANK", "-1")))
            world = int(os.environ.get("WORLD_SIZE", os.environ.get("TERSE_WORLD_SIZE", "0")))
            if rank < 0 or world < 1:
                raise terse.InvalidArgument("transport TCP: start the ranks with `terse launch -n N -- terse run "
                                            "CONFIG` (TERSE_RANK and TERSE_WORLD_SIZE are not set)")
            if world != spec.workers:
                raise terse.InvalidArgument("workers is %d but the job has %d ranks" % (spec.workers, world))
            try:
                check_workload(spec)
                early = None
            except Exception as e:  # noqa: BLE001  (the peers hear of it in the process group: _run_rank)
                early = e
            _run_rank(rank, world, spec, None, args.error_file, early)  # ends the process
        check_workload(spec)
        # The ranks start with this sys.path and import torch and terse first: a module folder before them would
        # shadow those imports with its files (a tokenize.py, a terse/); each rank's _load_module adds it back.
        for folder in _MODULE_FOLDERS:
            while folder in sys.path:
                sys.path.remove(folder)
        with tempfile.TemporaryDirectory(prefix="terse-train-") as tmp:
            mp.spawn(_spawned, args=(spec.workers, args, os.path.join(tmp, "store"), os.getpid()),
                     nprocs=spec.workers)
        return 0
    except mp.ProcessRaisedException as e:
        # The failing rank's traceback is the message; its exception's line is the error.
        summary = "rank %d: %s" % (e.error_index, _message(e.msg))
        _say("terse.train: a rank failed:\n%s" % e.msg)
    except mp.ProcessExitedException as e:
        summary = "rank %d exited with code %s" % (e.error_index, e.exit_code)
        # A rank that failed has said why (_report) and left its summary for terse run: this line would only repeat
        # it. One that died without a word (killed, or os._exit in the user's code) is named here.
        if not (args.error_file and os.path.exists(args.error_file)):
            _say("terse.train: %s" % summary)
    except KeyboardInterrupt:
        # A second SIGINT from here on would interrupt the ranks' ending with a traceback: terse run passes its own
        # on 2 s after a Ctrl-C that reached this process too (stop_signals.cc), and ranks busy in one long operation
        # take longer than that to leave. Pressed again, Ctrl-C makes terse run kill this process instead.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        # Ctrl-C reaches the ranks too (one process group), and each says so in a line of its own; the traceback of
        # mp.spawn's join that Python would print here says nothing more.
        summary = "interrupted"
        _say("terse.train: interrupted")
        _end_ranks()
    except Exception as e:  # noqa: BLE001  (any failure ends the run, reported to terse run)
        error = e
        summary = _report("", e)
    _write_error(args.error_file, summary, error)  # a failing rank's own summary goes first
    return 1


if __name__ == "__main__":
    sys.exit(main())
