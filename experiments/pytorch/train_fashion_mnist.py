#!/usr/bin/env python3
"""Trains a terse experiment's recipe in PyTorch with DistributedDataParallel and a terse compressor as DDP's
communication hook (docs/pytorch.md "Use terse compressors from PyTorch").

The recipe is a variant of a terse config (default: the quickstart study's "dense"), read through terse.Recipe: the
MLP with terse's initial parameters, the Fashion-MNIST arrays from terse's IDX reader, each rank's batches from terse's
shard sampler, and the learning rate of every step from terse's schedule -- the same recipe `terse run` trains, so
its results folder (--results) sits beside the native run's in `terse compare`. A variant with `local_sgd` trains
through terse.torch.LocalSGD on the native schedule (docs/local-sgd.md), and one with `data.partition: DIRICHLET` on
the native run's non-IID shards (terse.Recipe's batches). Ranks are processes of
torch.multiprocessing on gloo, CPU only, one thread each. PYTHONPATH is the build tree's python folder: build/python
from the default preset (build-cpu/python from the cpu preset), or none once the package is pip-installed.

    PYTHONPATH=build/python python3 experiments/pytorch/train_fashion_mnist.py \\
        --variant topk-1pct-ef --workers 2 --epochs 1 --results results
"""

import argparse
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

import terse
import terse.local_sgd
import terse.torch

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "configs", "quickstart.textproto")


def build_mlp(initial):
    """nn.Sequential of Linear + ReLU from terse's mlp parameters (fc<l>.weight [out, in], fc<l>.bias [out])."""
    layers = []
    pairs = [(initial[i], initial[i + 1]) for i in range(0, len(initial), 2)]
    for l, ((wname, w), (bname, b)) in enumerate(pairs):
        if wname != "fc%d.weight" % l or bname != "fc%d.bias" % l:
            raise ValueError("expected terse's mlp parameters fc%d.weight, fc%d.bias; got %s, %s" % (l, l, wname, bname))
        linear = nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(w))
            linear.bias.copy_(torch.from_numpy(b))
        layers.append(linear)
        if l + 1 < len(pairs):
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def evaluate(model, x, y):
    with torch.no_grad():
        logits = model(x.reshape(x.shape[0], -1))
        loss = F.cross_entropy(logits, y).item()
        accuracy = (logits.argmax(dim=1) == y).double().mean().item()
    return accuracy, loss


def parse_params(pairs):
    out = {}
    for kv in pairs or []:
        key, eq, value = kv.partition("=")
        if not eq or not key:
            raise SystemExit("--param expects KEY=VALUE, got %r" % kv)
        out[key] = value
    return out


class Setup:
    """What every rank derives from the command line and the recipe, the same on every rank."""

    def __init__(self, args):
        self.args = args
        self.recipe = terse.Recipe(args.config, args.variant, args.plugin_path)
        e = self.recipe.experiment
        if e["workload"]["name"] != "mlp":
            raise SystemExit("this example builds terse's mlp workload; the config names '%s'" % e["workload"]["name"])
        spec = e.get("compressor", {})
        self.compressor = args.compressor or spec.get("name", "none")
        # A compressor given on the command line replaces the config's whole spec, parameters included (the rule of
        # experiment.proto for a variant's PluginSpec).
        self.params = parse_params(args.param) if args.compressor else dict(spec.get("params", {}))
        mc = e.get("momentum_correction", {}).get("factor", 0.0)
        self.momentum_correction = args.momentum_correction if args.momentum_correction is not None else mc
        self.error_feedback = args.error_feedback if args.error_feedback is not None else e.get("error_feedback", False)
        self.optimizer = e.get("optimizer", {})
        self.seed = int(e.get("seed", 1))
        self.epochs = int(e.get("epochs", 1))
        ev = e.get("eval", {})
        self.every_steps = int(ev.get("every_steps", 0))
        self.per_epoch = bool(ev.get("per_epoch", True))
        self.variant = args.name or e["variant"]
        self.study = e["study"]
        self.local_sgd = terse.local_sgd.config_keywords(e)  # terse.torch.LocalSGD's keywords, or None


def worker(rank, args, store):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=args.workers)
    try:
        train(rank, Setup(args))
    finally:
        dist.destroy_process_group()


def train(rank, s):
    world = dist.get_world_size()
    recipe = s.recipe
    (train_x, train_y), (test_x, test_y) = recipe.data()
    train_x = torch.from_numpy(train_x).reshape(train_x.shape[0], -1)
    train_y = torch.from_numpy(train_y).long()
    test_x, test_y = torch.from_numpy(test_x), torch.from_numpy(test_y).long()

    model = build_mlp(recipe.initial_parameters())
    ddp = nn.parallel.DistributedDataParallel(model)
    # The config's parameters are text already (a config's params map); the state takes them as they are.
    state = terse.torch.CompressionState(
        s.compressor, params=s.params, error_feedback=bool(s.error_feedback),
        momentum_correction=float(s.momentum_correction), module=model, seed=s.seed, granularity=s.args.granularity)
    # Local SGD: gradient steps through the state before start_step, then local steps and averagings through it.
    local = terse.local_sgd.register(ddp, state, s.local_sgd)
    logger = None
    if s.args.results is not None:
        logger = terse.torch.ResultsLogger(s.args.results, study=s.study, variant=s.variant,
                                           state=state if local is None else local, description=recipe.text,
                                           data_partition=recipe.data_partition(world))
    opt = torch.optim.SGD(model.parameters(), lr=recipe.learning_rate(0, world),
                          momentum=float(s.optimizer.get("momentum", 0.0)),
                          nesterov=bool(s.optimizer.get("nesterov", False)),
                          weight_decay=float(s.optimizer.get("weight_decay", 0.0)))
    if local is not None:
        local.optimizer = opt  # the quadratic synchronization rule reads the rate the loop sets each step
    per_epoch = recipe.steps_per_epoch(world)
    total = per_epoch * s.epochs
    step, loss_since, steps_since = 0, 0.0, 0
    try:
        for epoch in range(s.epochs):
            for batch in recipe.batches(rank, world, epoch):
                lr = recipe.learning_rate(step, world)
                for group in opt.param_groups:
                    group["lr"] = lr
                index = torch.from_numpy(batch)
                opt.zero_grad(set_to_none=False)
                loss = F.cross_entropy(ddp(train_x[index]), train_y[index])
                loss.backward()
                opt.step()
                step += 1
                loss_since += loss.item()
                steps_since += 1
                evaluates = (s.every_steps and step % s.every_steps == 0) or (s.per_epoch and step % per_epoch == 0) \
                    or step == total
                if local is not None:
                    local.step(average=bool(evaluates))  # the native run averages at its evaluation points too
                if evaluates:
                    accuracy, test_loss = evaluate(model, test_x, test_y)
                    if logger is not None:
                        logger.record(test_accuracy=accuracy, test_loss=test_loss, test_examples=len(test_y),
                                      train_loss=loss_since / steps_since, epoch=step / per_epoch, lr=lr)
                    loss_since, steps_since = 0.0, 0
                    if rank == 0:
                        print("%s step %d/%d epoch %.2f: test accuracy %.4f, loss %.4f, payload %d B, wire %d B"
                              % (s.variant, step, total, step / per_epoch, accuracy, test_loss,
                                 state.totals()["payload"], state.totals()["wire_sent"]), flush=True)
    except BaseException as e:
        if logger is not None:
            logger.finish(error=e)
        raise
    # Before DDP and its process group go away: waits until torch has let go of the hook's callbacks (docs/pytorch.md).
    state.close()
    if logger is not None:
        logger.finish()
        if rank == 0:
            print("results in %s" % logger.results_dir)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=DEFAULT_CONFIG, help="terse experiment config (default: quickstart)")
    p.add_argument("--variant", default="dense", help="the config's variant to train (default: dense)")
    p.add_argument("--compressor", help="a terse compressor plugin, replacing the variant's (name or path)")
    p.add_argument("--param", action="append", help="KEY=VALUE for --compressor (repeatable)")
    p.add_argument("--error-feedback", dest="error_feedback", action="store_true", default=None)
    p.add_argument("--no-error-feedback", dest="error_feedback", action="store_false")
    p.add_argument("--momentum-correction", type=float, help="DGC momentum factor (default: the variant's)")
    p.add_argument("--granularity", default="tensor", choices=["tensor", "bucket"])
    p.add_argument("--workers", type=int, default=2, help="DDP processes (default 2)")
    p.add_argument("--results", help="results root: writes <results>/<study>/<name>/ as `terse run` does")
    p.add_argument("--name", help="the results folder's variant name (default: the config's variant)")
    p.add_argument("--plugin-path", action="append", default=[], help="searched first for plugins (repeatable)")
    args = p.parse_args(argv)
    if args.workers < 1:
        raise SystemExit("--workers must be >= 1, got %d" % args.workers)
    Setup(args)  # configuration errors surface here, once, before any process starts
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(worker, args=(args, os.path.join(tmp, "store")), nprocs=args.workers)


if __name__ == "__main__":
    sys.exit(main())
