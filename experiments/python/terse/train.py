"""The driver `terse run` starts for workload pytorch (experiment.proto PyTorch; experiments/runner/pytorch_runner.cc):
trains one resolved variant with DistributedDataParallel and terse's hook, into the results folder terse run made.

    python3 -m terse.train EXPERIMENT.textproto --out ROOT --folder NAME [--plugin-path DIR]...

EXPERIMENT is one resolved variant in terse's text format (terse run writes it; terse.Recipe loads and validates it
with the runner's own loader). The run is the recipe's: the compressor with its parameters, error feedback and DGC
momentum correction through terse.torch.CompressionState; SGD with the optimizer block's learning rate, schedule
(terse's own, through terse.Recipe.learning_rate), momentum, Nesterov, weight decay and gradient clipping; data
.batch_size examples per worker per step; the eval block's evaluation points; the seed. ResultsLogger writes
<ROOT>/<study>/<NAME>/ on rank 0.

Ranks. Transport INPROC: `workers` processes of this host (torch.multiprocessing), joined through a file store.
Transport TCP: this process is one rank of a `terse launch` job (TERSE_RANK, TERSE_WORLD_SIZE, TERSE_MASTER_ADDR; torch's
TCP store listens on TERSE_MASTER_PORT + 1, beside terse's own store on TERSE_MASTER_PORT), or of a torchrun job when
torchrun's RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT are set. Backend gloo on CPU, NCCL with device "cuda" (rank r
on GPU r mod the visible ones).

Data. torchvision models: Fashion-MNIST from data.dataset_dir (terse's IDX reader, data.train_subset and
test_subset), each 28x28 grey batch resized (bilinear) to image_size and repeated over `channels` as it is drawn, or
synthetic images and labels from the seed. A module's data(rank, world) gives this rank's shard and the test set.
Every epoch each rank draws its shard in a permutation seeded by (seed, epoch, rank); every rank takes the same number
of steps (the smallest shard's, cut at max_steps_per_epoch), since DDP needs every rank in every step.
"""

import argparse
import importlib.util
import math
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import terse
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
        ev = e.get("eval", {})
        self.every_steps = int(ev.get("every_steps", 0))
        self.per_epoch = bool(ev.get("per_epoch", True))
        comp = e.get("compressor", {})
        self.compressor = comp.get("name", "none")
        self.params = dict(comp.get("params", {}))
        self.error_feedback = bool(e.get("error_feedback", False))
        mc = e.get("momentum_correction", {})
        self.mc = float(mc.get("factor", 0.0))
        self.mc_masking = bool(mc.get("masking", True))
        self.mc_nesterov = bool(mc.get("nesterov", False))
        self.device = self.pt.get("device", "cpu")
        self.max_steps = int(self.pt.get("max_steps_per_epoch", 0))
        self.multi_process = e.get("transport", "INPROC") == "TCP"
        self.timeout_s = _duration_s(e.get("tcp", {}).get("timeout", "30s"))
        self.plugin_timeout_s = _duration_s(e.get("plugin_timeout", "60s"))


# ---- model and data


def _load_module(path):
    spec = importlib.util.spec_from_file_location("terse_user_model", path)
    if spec is None or spec.loader is None:
        raise terse.ConfigError("workload.pytorch.module: cannot load %s as a Python module" % path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in ("model", "data"):
        if not callable(getattr(module, name, None)):
            raise terse.ConfigError("workload.pytorch.module: %s defines no %s()" % (path, name))
    return module


def build_model(spec, user):
    if user is not None:
        model = user.model()
    else:
        import torchvision  # only torchvision models need it

        ctor = getattr(torchvision.models, spec.pt["torchvision"], None)
        if not callable(ctor):
            raise terse.ConfigError("workload.pytorch.torchvision: torchvision %s has no model %r"
                                    % (torchvision.__version__, spec.pt["torchvision"]))
        model = ctor(num_classes=int(spec.pt["num_classes"]))
    if not isinstance(model, torch.nn.Module):
        raise terse.ConfigError("workload.pytorch: model() returned %s, not a torch.nn.Module" % type(model).__name__)
    return model


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


def shard(n, rank, world):
    """This rank's example indices: an equal share of n (the remainder is left out so every shard is as long)."""
    per = n // world
    return torch.arange(rank * per, (rank + 1) * per)


# ---- one rank


def init_group(spec, rank, world, store_path):
    backend = "nccl" if spec.device == "cuda" else "gloo"
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


def evaluate(model, x_all, y_all, prepare, device, batch=256):
    model.eval()
    correct, total, loss_sum = 0, 0, 0.0
    with torch.no_grad():
        for i in range(0, len(y_all), batch):
            x = prepare(x_all[i:i + batch]).to(device)
            y = y_all[i:i + batch].to(device)
            logits = model(x)
            logits, y = logits.reshape(-1, logits.shape[-1]), y.reshape(-1)
            loss_sum += F.cross_entropy(logits, y, reduction="sum").item()
            correct += (logits.argmax(dim=1) == y).sum().item()
            total += y.numel()
    model.train()
    return correct / max(1, total), loss_sum / max(1, total)


def train_rank(rank, world, spec, store_path):
    torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
    init_group(spec, rank, world, store_path)
    logger = None
    state = None
    try:
        if spec.device == "cuda":
            device = torch.device("cuda", rank % torch.cuda.device_count())
            torch.cuda.set_device(device)
        else:
            device = torch.device("cpu")
        torch.manual_seed(spec.seed)  # the same initial model on every rank (DDP broadcasts rank 0's anyway)
        user = _load_module(spec.pt["module"]) if "module" in spec.pt else None
        model = build_model(spec, user).to(device)
        if user is not None:
            (train_x, train_y), (test_x, test_y) = user.data(rank, world)
            prepare = lambda x: x  # noqa: E731
            own = torch.arange(len(train_y))
        else:
            images = ImageData(spec)
            train_x, train_y, test_x, test_y = images.train_x, images.train_y, images.test_x, images.test_y
            prepare = images.inputs
            own = shard(len(train_y), rank, world)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.index is not None
                                                        else None)
        state = terse.torch.CompressionState(
            spec.compressor, params=spec.params, error_feedback=spec.error_feedback, momentum_correction=spec.mc,
            momentum_masking=spec.mc_masking, momentum_nesterov=spec.mc_nesterov, module=model, seed=spec.seed,
            plugin_path=spec.args.plugin_path, plugin_timeout=spec.plugin_timeout_s)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        logger = terse.torch.ResultsLogger(spec.args.out, study=spec.study, variant=spec.args.folder, state=state,
                                           description=spec.text)
        # Every rank takes the same number of steps: the smallest shard's.
        # On the model's device: NCCL (device "cuda") carries CUDA tensors only.
        steps = torch.tensor([len(own) // spec.batch], dtype=torch.int64, device=device)
        dist.all_reduce(steps, op=dist.ReduceOp.MIN)
        per_epoch = int(steps.item())
        if spec.max_steps > 0:
            per_epoch = min(per_epoch, spec.max_steps)
        if per_epoch < 1:
            raise terse.ConfigError("data.batch_size: %d examples per step, but a rank's shard holds %d"
                                    % (spec.batch, len(own)))
        opt = torch.optim.SGD(model.parameters(), lr=spec.recipe.learning_rate(0, world, per_epoch),
                              momentum=spec.momentum, nesterov=spec.nesterov, weight_decay=spec.weight_decay)
        total = per_epoch * spec.epochs
        step, loss_since, steps_since, start = 0, 0.0, 0, time.perf_counter()
        for epoch in range(spec.epochs):
            g = torch.Generator().manual_seed(spec.seed * 1000003 + epoch * 1009 + rank)
            order = own[torch.randperm(len(own), generator=g)]
            for b in range(per_epoch):
                index = order[b * spec.batch:(b + 1) * spec.batch]
                x = prepare(train_x[index]).to(device, non_blocking=True)
                y = train_y[index].to(device, non_blocking=True)
                lr = spec.recipe.learning_rate(step, world, per_epoch)
                for group in opt.param_groups:
                    group["lr"] = lr
                opt.zero_grad(set_to_none=False)
                logits = ddp(x)
                loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
                loss.backward()
                if spec.clip > 0:
                    torch.nn.utils.clip_grad_norm_(model.parameters(), spec.clip)
                opt.step()
                step += 1
                loss_since += loss.item()
                steps_since += 1
                if (spec.every_steps and step % spec.every_steps == 0) or (spec.per_epoch and step % per_epoch == 0) \
                        or step == total:
                    accuracy, test_loss = evaluate(model, test_x, test_y, prepare, device)
                    logger.record(test_accuracy=accuracy, test_loss=test_loss, test_examples=len(test_y),
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
        if logger is not None:
            logger.finish(error="%s: %s" % (type(e).__name__, e))
        raise e


def _leave(code, error_file=None, summary=None):
    """Ends a rank's process at once, without the interpreter's teardown. Tearing down a gloo process group joins
    gloo's worker threads while holding the GIL, and a worker dropping the last reference to a tensor made in Python
    needs the GIL: torch 1.13 can hang there (seen at the end of runs of this driver). Everything worth keeping is
    written by now: metrics are flushed per record, the status is written atomically, and the error summary goes to
    the file terse run reads (the first failing rank's; later ones leave it)."""
    if error_file and summary is not None:
        try:
            with open(error_file, "x") as f:
                f.write(summary + "\n")
        except FileExistsError:
            pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _run_rank(rank, world, spec, store_path, error_file):
    # A fatal signal (a crashing plugin) names the rank and the plugin call on stderr and in the error file, which
    # terse run turns into the status (core/common/crash.h); the process still dies of the signal.
    terse._terse.install_crash_handler(rank, error_file or "")
    try:
        train_rank(rank, world, spec, store_path)
    except BaseException as e:  # noqa: BLE001  (reported to terse run, then the process ends)
        traceback.print_exc()
        _leave(1, error_file, "rank %d: %s: %s" % (rank, type(e).__name__, _last_line(e)))
    _leave(0)


def _spawned(rank, world, args, store_path):
    # Each process loads the experiment itself: a terse.Recipe does not cross a process boundary.
    try:
        spec = Spec(args)
    except BaseException as e:  # noqa: BLE001
        traceback.print_exc()
        _leave(1, args.error_file, "rank %d: %s: %s" % (rank, type(e).__name__, _last_line(e)))
    _run_rank(rank, world, spec, store_path, args.error_file)


def _last_line(text):
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[-1] if lines else str(text)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python3 -m terse.train", description=__doc__.split("\n\n")[0])
    p.add_argument("experiment", help="one resolved variant, in terse's text format")
    p.add_argument("--out", required=True, help="the results root")
    p.add_argument("--folder", required=True, help="the variant's results folder name")
    p.add_argument("--plugin-path", action="append", default=[], help="search DIR for plugins (repeatable)")
    p.add_argument("--error-file", help="on failure, write the error's one-line summary here (for terse run)")
    args = p.parse_args(argv)
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
            _run_rank(rank, world, spec, None, args.error_file)
        else:
            with tempfile.TemporaryDirectory(prefix="terse-train-") as tmp:
                mp.spawn(_spawned, args=(spec.workers, args, os.path.join(tmp, "store")), nprocs=spec.workers)
        return 0
    except mp.ProcessRaisedException as e:
        # The failing rank's traceback is the message; its last line is the error.
        summary = "rank %d: %s" % (e.error_index, _last_line(e.msg))
        print("terse.train: a rank failed:\n%s" % e.msg, file=sys.stderr)
    except mp.ProcessExitedException as e:
        summary = "rank %d exited with code %s" % (e.error_index, e.exit_code)
        print("terse.train: %s" % summary, file=sys.stderr)
    except Exception as e:  # noqa: BLE001  (any failure ends the run, reported to terse run)
        summary = "%s: %s" % (type(e).__name__, e)
        if not isinstance(e, terse.Error):
            traceback.print_exc()
        print("terse.train: %s" % summary, file=sys.stderr)
    if args.error_file and not os.path.exists(args.error_file):  # a failing rank's own summary goes first
        with open(args.error_file, "w") as f:
            f.write(summary + "\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
