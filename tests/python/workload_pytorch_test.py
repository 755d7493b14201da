#!/usr/bin/env python3
"""Workload pytorch end to end: `terse run` of configs naming PyTorch models (experiment.proto PyTorch), trained by the
Python package's driver through terse's DDP hook. One ctest case per subcommand (tests/python/CMakeLists.txt):

  inproc    a 2-worker study of two variants -- the GPT-style module of experiments/configs/models (named relative to
            the config) dense, and torchvision's ResNet-18 on synthetic 16x16 images with top-k 1% + EF -- writes
            completed results folders whose bytes follow the compressors, and `terse compare` tables both
  tcp       the same module as 2 processes of `terse launch` (transport TCP): rank 0 writes the folder; its steps per
            epoch come from `terse run --set`, which every rank applies and the folder's config records; a module
            whose data() fails on rank 1 alone fails the variant on both ranks with rank 1's reason, and both skip
            the next variant of that workload
  failures  a module whose model() raises, one whose forward raises in the check forward, one whose rank 1 dies in
            data(), one failing in training with torch's multi-line text (or its Ctrl-C): terse run fails, naming the
            error's informative line, no folder is left "running", and after the module's own failure before
            training the next variant is skipped
  refusals  what is wrong with the model or its data rather than in the user's code, each refused in one line with
            no traceback: a missing module file by the config's validation (no driver starts), a module that does not
            parse or lacks data(), data() returning the wrong shape or float labels, an unknown torchvision name,
            device "cuda" without CUDA, data() and model() that do not fit (input dtype or features, labels past
            the outputs, a bfloat16 model on gloo, an unused parameter; the model imported from a sibling file); the
            variants after a refused one that share its workload are skipped, their folders saying so (replacing an
            earlier study's), and a variant with another workload still runs
  optimizer_loss  optimizer kind ADAMW and a module's loss(): the first step moves every weight by the learning
            rate (Adam's first update, where SGD's would follow the gradient), the module's loss gives the metrics'
            train and test loss, config.textproto records the kind and its resolved betas and eps; a loss() that
            returns no scalar is refused in one line naming loss()
  unused_parameters  DDP's find_unused_parameters: a model with a branch it never uses is refused naming the field
            and trains with it set (a variant of its own, which the refusal does not skip); a model whose branch
            only some steps take fails at the step after, naming the field instead of torch's page of causes
  provenance  what a run's folder says of its code and data: a module importing a sibling and a package, run from
            another folder, then with the sibling edited from a config naming the module by an absolute path through
            a link: the config names the module by its canonical path both times and holds no data fields the module
            replaced, `terse compare` warns of different workloads only beside a folder naming another module, the
            module's own hash stays and the hash over its files changes (shown by `terse compare --provenance`), and
            the plugin is recorded where it was loaded from (the build tree, as a native run records it)
  agreement  the TCP ranks' agreement before training with the gather faked: three ranks, two failing with
            different kinds, all take the lowest failing rank's kind
  local_sgd  local_sgd for a PyTorch model: the variants' bytes follow their averagings, the configs hold the schedule
            and terse run prints the native runner's warning for evaluations off the period's grid
  noniid    data.partition DIRICHLET for a torchvision model on Fashion-MNIST: provenance.json's data_partition is a
            native run's; a module's data and synthetic labels are refused
  datasets  data() returning Datasets: trained through DataLoaders bit for bit as tensors of the same items (with no
            loader workers and with two); an IterableDataset, items that do not collate or are no pairs, a label past
            the model's classes in a later batch, loader_workers for tensors: each refused in one line; a __getitem__
            that raises in a loader worker fails the variant with the module's error
  evaluate  test accuracy and loss leave out padding labels (-100), through cross-entropy and a module's loss()
"""

import argparse
import importlib.util
import json
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile

ARGS = None


def check(cond, message):
    if not cond:
        raise AssertionError(message)


def study(name, workload, variants, workers=2, transport="INPROC", batch=4, extra="",
          optimizer="lr: 0.05 momentum: 0.9"):
    return """study: "%s"
workload { name: "pytorch" pytorch { %s } }
data { batch_size: %d test_subset: 64 }
optimizer { %s }
workers: %d
mode: SYNC
transport: %s
compressor { name: "none" }
epochs: 1
eval { per_epoch: true }
seed: 3
%s
%s
""" % (name, workload, batch, optimizer, workers, transport, extra, variants)


def run(cmd, cwd, expect_ok=True, timeout=600):
    env = dict(os.environ, OMP_NUM_THREADS="1", TERSE_PLUGIN_PATH="")
    p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if expect_ok:
        check(p.returncode == 0, "%s failed (%d):\n%s\n%s" % (" ".join(cmd), p.returncode, p.stdout, p.stderr))
    return p


def folder(root, study_name, variant):
    d = os.path.join(root, study_name, variant)
    status = json.load(open(os.path.join(d, "status.json")))
    lines = [json.loads(x) for x in open(os.path.join(d, "metrics.jsonl")).read().splitlines() if x]
    return status, lines


def skipped_status(root, study_name, variant, refused):
    """Whether the variant's folder says it was skipped after the refused variant failed before training."""
    status = json.load(open(os.path.join(root, study_name, variant, "status.json")))
    return status["state"] == "failed" and status["error"].startswith(
        "skipped: it has the workload, data and workers of variant '%s'" % refused)


def copy_model(tmp):
    # The module sits beside the config and is named relative to it: terse run resolves it from the config's folder.
    os.makedirs(os.path.join(tmp, "models"), exist_ok=True)
    shutil.copy(os.path.join(ARGS.source, "experiments", "configs", "models", "tiny_gpt.py"),
                os.path.join(tmp, "models", "tiny_gpt.py"))


def inproc(tmp):
    copy_model(tmp)
    cfg = os.path.join(tmp, "study.textproto")
    # The base names no model; each variant brings its own (a variant's block merges into the base's).
    open(cfg, "w").write(study("pt", "", """
variants {
  name: "gpt-dense"
  overrides { workload { pytorch { module: "models/tiny_gpt.py" max_steps_per_epoch: 3 } } }
}
variants {
  name: "resnet-topk"
  overrides {
    workload {
      pytorch { torchvision: "resnet18" data: SYNTHETIC image_size: 16 synthetic_examples: 64 max_steps_per_epoch: 2 }
    }
    compressor { name: "topk" params { key: "ratio" value: "0.01" } }
    error_feedback: true
  }
}
variants {
  name: "gpt-topk-ef21"
  overrides {
    workload { pytorch { module: "models/tiny_gpt.py" max_steps_per_epoch: 3 } }
    compressor { name: "topk" params { key: "ratio" value: "0.05" } }
    error_feedback: true
    error_feedback_rule: EF21
    ef21_momentum: 0.5
    compression_start_step: 2
    optimizer { momentum: 0 }
  }
}"""))
    out = os.path.join(tmp, "results")
    elsewhere = tempfile.mkdtemp(dir=tmp)  # not the config's folder: the module is found from the config's
    p = run([ARGS.terse, "run", cfg, "--out", out], cwd=elsewhere)
    gpt_status, gpt = folder(out, "pt", "gpt-dense")
    res_status, res = folder(out, "pt", "resnet-topk")
    for name, status, lines, steps in (("gpt-dense", gpt_status, gpt, 3), ("resnet-topk", res_status, res, 2)):
        check(status["state"] == "completed", "%s: status %s" % (name, status))
        check(len(lines) == 1 and lines[-1]["step"] == steps, "%s: records %s" % (name, lines))
        check(0 <= lines[-1]["test_accuracy"] <= 1, "%s: accuracy %s" % (name, lines[-1]))
    # Dense GPT: every step allreduces all of its f32 gradients (and terse's 16-byte header per tensor).
    spec = importlib.util.spec_from_file_location("tiny_gpt", os.path.join(tmp, "models", "tiny_gpt.py"))
    tiny_gpt = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny_gpt)
    gpt_params = sum(p.numel() for p in tiny_gpt.model().parameters())
    check(gpt[-1]["payload_bytes_per_worker"] >= 3 * 4 * gpt_params,
          "gpt dense payload %d below 3 steps of %d parameters" % (gpt[-1]["payload_bytes_per_worker"], gpt_params))
    resnet_dense = 2 * 4 * 11_181_642  # two steps of ResNet-18's 11.2M f32 gradients, uncompressed
    check(res[-1]["payload_bytes_per_worker"] < resnet_dense / 10,
          "resnet top-k 1%% payload %d is not a small part of dense %d" % (res[-1]["payload_bytes_per_worker"],
                                                                           resnet_dense))
    config = open(os.path.join(out, "pt", "resnet-topk", "config.textproto")).read()
    check('torchvision: "resnet18"' in config and 'name: "topk"' in config, "config.textproto:\n%s" % config)
    # EF21 reaches the hook from the config, and the results' config says what the hook ran.
    ef21_status, ef21 = folder(out, "pt", "gpt-topk-ef21")
    check(ef21_status["state"] == "completed" and ef21[-1]["step"] == 3, "gpt-topk-ef21: %s %s" % (ef21_status, ef21))
    config = open(os.path.join(out, "pt", "gpt-topk-ef21", "config.textproto")).read()
    check("error_feedback_rule: EF21" in config and "ef21_momentum: 0.5" in config
          and "compression_start_step: 2" in config, "config.textproto:\n%s" % config)
    # Its dense warm-up too: two steps of every f32 gradient, then one of top-k 5%.
    warm = ef21[-1]["payload_bytes_per_worker"]
    check(2 * 4 * gpt_params <= warm < 2.5 * 4 * gpt_params,
          "gpt-topk-ef21's payload %d is not two dense steps of %d parameters and one of top-k" % (warm, gpt_params))
    # The module's file is named by path in the config; its hash is in the provenance, so an edit shows.
    code = open(os.path.join(tmp, "models", "tiny_gpt.py"), "rb").read()
    hooks = {v: json.load(open(os.path.join(out, "pt", v, "provenance.json"))).get("hook", {})
             for v in ("gpt-dense", "resnet-topk")}
    check(hooks["gpt-dense"].get("module_sha256") == hashlib.sha256(code).hexdigest()
          and "module_sha256" not in hooks["resnet-topk"], "provenance.json's hook: %s" % hooks)
    # The torchvision model's run records torchvision's version (torch's is in the transport); the module's, which
    # imports no torchvision, does not.
    version = subprocess.run([sys.executable, "-c", "import torchvision; print(torchvision.__version__)"],
                             capture_output=True, text=True, check=True).stdout.strip()
    check(hooks["resnet-topk"].get("torchvision") == version and "torchvision" not in hooks["gpt-dense"],
          "torchvision %s, provenance.json's hook: %s" % (version, hooks))
    check("resnet-topk" in p.stdout and "gpt-dense" in p.stdout, "terse run's table:\n%s" % p.stdout)
    table = run([ARGS.terse, "compare", os.path.join(out, "pt"), "--format", "csv"], cwd=tmp).stdout
    rows = {line.split(",")[1] for line in table.splitlines() if "," in line}
    check({"gpt-dense", "resnet-topk"} <= rows, "`terse compare` does not list both:\n%s" % table)
    print("inproc: gpt %d B, resnet top-k %d B per worker" % (gpt[-1]["payload_bytes_per_worker"],
                                                              res[-1]["payload_bytes_per_worker"]))


def tcp(tmp):
    copy_model(tmp)
    cfg = os.path.join(tmp, "study.textproto")
    open(cfg, "w").write(study("pt", 'module: "models/tiny_gpt.py" max_steps_per_epoch: 50', 'variants { name: "a" }',
                               transport="TCP"))
    out = os.path.join(tmp, "results")
    run([ARGS.terse, "launch", "-n", "2", "--", ARGS.terse, "run", cfg, "--out", out,
         "--set", "workload.pytorch.max_steps_per_epoch=2"], cwd=tmp)
    status, lines = folder(out, "pt", "a")
    check(status["state"] == "completed" and lines[-1]["step"] == 2, "tcp: %s %s" % (status, lines))
    config = open(os.path.join(out, "pt", "a", "config.textproto")).read()
    check("max_steps_per_epoch: 2\n" in config, "tcp: config.textproto:\n%s" % config)
    print("tcp: 2 ranks, %d steps" % lines[-1]["step"])
    # One rank's module fails before training (data() raises on rank 1 only): both ranks fail the variant with rank
    # 1's reason, at once rather than at the timeout, and both skip the variant after, which shares the workload.
    # Before the ranks agreed (train.py, _agree_before_training), rank 0 waited out the timeout and then ran "w".
    open(os.path.join(tmp, "rank1_data.py"), "w").write(RANK1_DATA)
    cfg = os.path.join(tmp, "rank1.textproto")
    open(cfg, "w").write(study("r1", 'module: "rank1_data.py"',
                               'variants { name: "v" } variants { name: "w" overrides { optimizer { lr: 0.1 } } }',
                               transport="TCP", extra='tcp { timeout: "120s" }'))
    p = run([ARGS.terse, "launch", "-n", "2", "--", ARGS.terse, "run", cfg, "--out", out], cwd=tmp,
            expect_ok=False)
    check(p.returncode != 0, "tcp rank1: terse launch succeeded:\n%s" % p.stdout)
    status = json.load(open(os.path.join(out, "r1", "v", "status.json")))
    check(status["state"] == "failed" and "rank 1" in status["error"] and "data() on rank 1 fails" in status["error"],
          "tcp rank1: status %s" % status)
    check(p.stderr.count("variant 'w' skipped") == 2 and skipped_status(out, "r1", "w", "v"),
          "tcp rank1: both ranks should skip 'w':\n%s" % p.stderr)
    print("tcp: rank 1's data() failure -> %s" % status["error"][:160])


BROKEN_MODEL = '''
import torch
def model():
    raise ValueError("no model here on purpose")
def data(rank, world):
    x = torch.zeros(8, 4)
    return (x, torch.zeros(8, dtype=torch.long)), (x, torch.zeros(8, dtype=torch.long))
'''

DYING_RANK = '''
import os
import torch
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    if rank == 1:
        os._exit(3)
    x = torch.zeros(8, 4)
    return (x, torch.zeros(8, dtype=torch.long)), (x, torch.zeros(8, dtype=torch.long))
'''


RANK1_DATA = '''
import torch
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    if rank == 1:
        raise ValueError("data() on rank 1 fails on purpose")
    x = torch.zeros(8, 4)
    return (x, torch.zeros(8, dtype=torch.long)), (x, torch.zeros(8, dtype=torch.long))
'''


BAD_FORWARD = '''
import torch
class Bad(torch.nn.Linear):
    def forward(self, x):
        raise ValueError("forward fails on purpose")
def model():
    return Bad(4, 2)
def data(rank, world):
    x = torch.zeros(8, 4)
    return (x, torch.zeros(8, dtype=torch.long)), (x, torch.zeros(8, dtype=torch.long))
'''

# Fails in its third forward (the driver's check forward, then two steps) with the text torch gives an error out of
# its C++ code: the message, then "\n\nAt:\n" and the Python frames. %r is the message.
LATE = '''
import torch
class Late(torch.nn.Linear):
    calls = 0
    def forward(self, x):
        Late.calls += 1
        if Late.calls == 3:
            raise RuntimeError(%r + "\\n\\nAt:\\n  /usr/lib/python3.11/threading.py(995): _bootstrap\\n")
        return super().forward(x)
def model():
    return Late(4, 2)
def data(rank, world):
    x = torch.zeros(8, 4)
    return (x, torch.zeros(8, dtype=torch.long)), (x, torch.zeros(8, dtype=torch.long))
'''


def failures(tmp):
    # The module's own failures before training (its model() raising, its forward failing in the check forward) fail
    # every variant alike: the variant after is skipped. One rank dying, or a failure in training, is the variant's.
    for name, source, fragment, workers in (
            ("broken", BROKEN_MODEL, "no model here on purpose", 2),
            ("bad_forward", BAD_FORWARD, "the model's forward on train_x[:4] of data(0, 1)", 1),
            ("late_error", LATE % "the first line says it\nbut not the last one",
             "RuntimeError: the first line says it", 1),
            ("interrupted", LATE % "KeyboardInterrupt: <EMPTY MESSAGE>", "interrupted", 1),
            ("dying", DYING_RANK, "", 2)):
        open(os.path.join(tmp, name + ".py"), "w").write(source)
        cfg = os.path.join(tmp, name + ".textproto")
        # A short timeout: the surviving rank of "dying" is released by the driver, not by a 30 s default.
        second = 'variants { name: "w" overrides { optimizer { lr: 0.1 } } }' if name in ("broken",
                                                                                         "bad_forward") else ""
        open(cfg, "w").write(study(name, 'module: "%s.py"' % name, 'variants { name: "v" }' + second,
                                   extra='tcp { timeout: "10s" }', workers=workers))
        out = os.path.join(tmp, "results")
        p = run([ARGS.terse, "run", cfg, "--out", out], cwd=tmp, expect_ok=False, timeout=300)
        check(p.returncode != 0, "%s: terse run succeeded:\n%s" % (name, p.stdout))
        status = json.load(open(os.path.join(out, name, "v", "status.json")))
        check(status["state"] == "failed", "%s: status %s" % (name, status))
        check(fragment in status.get("error", ""), "%s: status error %r lacks %r" % (name, status.get("error"),
                                                                                      fragment))
        check(fragment in p.stderr, "%s: terse run's message lacks %r:\n%s" % (name, fragment, p.stderr))
        if name in ("broken", "bad_forward"):
            # An exception of the user's code keeps its traceback, from the user's frames on: the driver's are noise.
            trace = p.stderr[p.stderr.find("Traceback"):]
            line = 'broken.py", line 4, in model' if name == "broken" else 'bad_forward.py", line 5, in forward'
            check("Traceback" in p.stderr and line in trace and "train.py" not in trace,
                  "%s: not the user's traceback:\n%s" % (name, p.stderr))
            check("variant 'w' skipped" in p.stderr and skipped_status(out, name, "w", "v"),
                  "%s: the variant after was not skipped:\n%s" % (name, p.stderr))
        # The error's informative line, not torch's frame list after it, nor the message's last line.
        check("_bootstrap" not in status["error"] and "last one" not in status["error"]
              and "KeyboardInterrupt" not in status["error"], "%s: status error %r" % (name, status["error"]))
        print("failures: %s -> %s" % (name, status["error"][:160]))
    # A plugin that crashes (SIGSEGV) in the hook on rank 1: the rank's crash handler names the plugin call in the
    # driver's error file, and the status says so (core/common/crash.h); a plugin that hangs past plugin_timeout
    # fails its bucket and the run, naming it.
    copy_model(tmp)
    plugin = os.path.join(ARGS.fixture_dir, "terse_compressor_misbehave.so")
    for name, fault, fragment in (("crashing", "crash", "rank 1 died of SIGSEGV in compressor 'misbehave'"),
                                  ("hanging", "hang", "has not returned after")):
        cfg = os.path.join(tmp, name + ".textproto")
        variant = ('variants { name: "v" overrides { compressor { name: "%s" params { key: "fault" value: "%s" } '
                   'params { key: "rank" value: "1" } params { key: "after" value: "2" } } } }' % (plugin, fault))
        open(cfg, "w").write(study(name, 'module: "models/tiny_gpt.py" max_steps_per_epoch: 3', variant,
                                   extra='tcp { timeout: "10s" }\nplugin_timeout: "2s"'))
        out = os.path.join(tmp, "results")
        p = run([ARGS.terse, "run", cfg, "--out", out], cwd=tmp, expect_ok=False, timeout=300)
        check(p.returncode != 0, "%s: terse run succeeded:\n%s" % (name, p.stdout))
        status = json.load(open(os.path.join(out, name, "v", "status.json")))
        check(status["state"] == "failed" and fragment in status.get("error", "")
              and "misbehave" in status.get("error", ""), "%s: status %s" % (name, status))
        print("failures: %s -> %s" % (name, status["error"][:200]))


NO_DATA = '''
import torch
def model():
    return torch.nn.Linear(4, 2)
'''

NO_MODEL = '''
import torch
def data(rank, world):
    x = torch.zeros(8, 4)
    return (x, torch.zeros(8, dtype=torch.long)), (x, torch.zeros(8, dtype=torch.long))
'''

SYNTAX_ERROR = '''
import torch
def model(:
    return torch.nn.Linear(4, 2)
'''

FLAT_DATA = '''
import torch
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    return torch.zeros(8, 4), torch.zeros(8, dtype=torch.long)
'''

FLOAT_LABELS = '''
import torch
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    x = torch.zeros(8, 4)
    return (x, torch.zeros(8)), (x, torch.zeros(8))
'''

MLP = '''
import torch
def mlp(features, classes):
    return torch.nn.Sequential(torch.nn.Linear(features, 16), torch.nn.ReLU(), torch.nn.Linear(16, classes))
'''

MISMATCH = '''
import torch
from mlp import mlp
class Unused(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(32, 10)
        self.spare = torch.nn.Linear(32, 10)
    def forward(self, x):
        return self.used(x)
def model():
    return %s
def data(rank, world):
    x, y = %s, %s
    return (x, y), (x, y)
'''


def refusals(tmp):
    out = os.path.join(tmp, "results")

    def refused(name, workload, variants='variants { name: "v" }', workers=2):
        cfg = os.path.join(tmp, name + ".textproto")
        open(cfg, "w").write(study(name, workload, variants, workers=workers))
        p = run([ARGS.terse, "run", cfg, "--out", out], cwd=tmp, expect_ok=False, timeout=300)
        check(p.returncode != 0, "%s: terse run succeeded:\n%s" % (name, p.stdout))
        # terse's own refusals are a line each: a traceback is for an exception of the user's code alone.
        check("Traceback" not in p.stderr, "%s: a traceback for a refusal:\n%s" % (name, p.stderr))
        # Each rank's message is one write ending in a newline: no two run together on a line.
        check(all(line.find("terse.train:") <= 0 for line in p.stderr.splitlines()),
              "%s: ranks' messages run together:\n%s" % (name, p.stderr))
        return p.stderr

    # A missing module is the config's error, at its line, before any folder or driver.
    err = refused("missing", 'module: "models/none.py"')
    check("missing.textproto:2:" in err and "workload.pytorch.module: no file '%s'" % os.path.join(tmp, "models",
                                                                                                   "none.py") in err
          and "terse.train" not in err, "missing: %s" % err)
    check(not os.path.exists(os.path.join(out, "missing")), "missing: a results folder was made")

    # A module without data(), in a study of four variants: the first fails naming the module, the two that train the
    # same workload are skipped, their folders saying so (one replaces the completed folder of an earlier study, which
    # `terse compare` would otherwise show as this study's), and the variant with another module runs, to fail for its
    # own reason.
    for name, source in (("no_data", NO_DATA), ("no_model", NO_MODEL), ("syntax_error", SYNTAX_ERROR),
                         ("flat_data", FLAT_DATA), ("float_labels", FLOAT_LABELS)):
        open(os.path.join(tmp, name + ".py"), "w").write(source)
    kept = os.path.join(out, "no_data", "c")
    os.makedirs(kept)
    open(os.path.join(kept, "status.json"), "w").write('{"state":"completed"}\n')
    open(os.path.join(kept, "metrics.jsonl"), "w").write('{"step":1,"test_accuracy":0.5}\n')
    err = refused("no_data", 'module: "no_data.py"', """
variants { name: "a" }
variants { name: "b" overrides { compressor { name: "topk" params { key: "ratio" value: "0.5" } } } }
variants { name: "other" overrides { workload { pytorch { module: "no_model.py" } } } }
variants { name: "c" overrides { error_feedback: true } }""")
    no_data = "workload.pytorch.module: %s defines no data(rank, world)" % os.path.join(tmp, "no_data.py")
    check(err.count("terse.train: " + no_data) == 1, "no_data: not one line of the driver's:\n%s" % err)
    status = json.load(open(os.path.join(out, "no_data", "a", "status.json")))
    check(status["state"] == "failed" and no_data in status["error"], "no_data: status %s" % status)
    for skipped in ("b", "c"):
        check("variant '%s' skipped" % skipped in err, "no_data: %s not skipped:\n%s" % (skipped, err))
        check(skipped_status(out, "no_data", skipped, "a"), "no_data: %s's folder does not say it was skipped"
              % skipped)
    check(open(os.path.join(kept, "metrics.jsonl")).read() == "", "no_data: c's earlier records are still there")
    check("defines no model()" in json.load(open(os.path.join(out, "no_data", "other", "status.json")))["error"],
          "no_data: the variant with another module did not run:\n%s" % err)

    err = refused("syntax_error", 'module: "syntax_error.py"')
    check("workload.pytorch.module: %s:3:" % os.path.join(tmp, "syntax_error.py") in err and "SyntaxError" in err
          and "def model(:" in err, "syntax_error: %s" % err)

    # data()'s return, checked on every rank before the process group: one line a rank. Whichever rank says it first
    # ends the job, so the other rank's line may never be printed: either rank's will do.
    err = refused("flat_data", 'module: "flat_data.py"')
    check(any("data(%d, 2) in %s returned (Tensor[8, 4] float32, Tensor[8] int64); expected ((train_x, train_y), "
              "(test_x, test_y))" % (rank, os.path.join(tmp, "flat_data.py")) in err for rank in (0, 1)),
          "flat_data: %s" % err)
    err = refused("float_labels", 'module: "float_labels.py"', workers=1)
    check("data(0, 1) in %s: train_y is float32; labels are class indices" % os.path.join(tmp, "float_labels.py")
          in err, "float_labels: %s" % err)

    err = refused("torchvision", 'torchvision: "resnet181" data: SYNTHETIC image_size: 8 synthetic_examples: 8')
    check("workload.pytorch.torchvision: torchvision" in err and "has no model 'resnet181' (did you mean 'resnet18'"
          in err, "torchvision: %s" % err)

    # data() and model() that do not fit, found by the check forward of one batch before any process group, in a line
    # naming both and what does not fit rather than torch's traceback. The model comes from a sibling file, which
    # the module imports as under `python3 FILE` (its folder first on sys.path).
    open(os.path.join(tmp, "mlp.py"), "w").write(MLP)
    path = os.path.join(tmp, "%s.py")
    for name, model, x, y, workers, fragments in (
            ("f64", "mlp(32, 10)", "torch.zeros(8, 32, dtype=torch.float64)", "torch.zeros(8, dtype=torch.long)", 2,
             ["(Tensor[4, 32] float64) raised RuntimeError: mat1 and mat2 must have the same dtype",
              "train_x is float64, the model's parameters float32"]),
            ("features", "mlp(32, 10)", "torch.zeros(8, 31)", "torch.zeros(8, dtype=torch.long)", 1,
             ["(Tensor[4, 31] float32) raised RuntimeError: mat1 and mat2 shapes cannot be multiplied",
              "takes 32 input features"]),
            ("labels", "mlp(32, 5)", "torch.zeros(8, 32)", "torch.arange(8)", 1,
             ["train_y holds labels 0..7, but the model's forward gives 5 class scores an example"]),
            ("bf16", "mlp(32, 10).bfloat16()", "torch.zeros(8, 32, dtype=torch.bfloat16)",
             "torch.zeros(8, dtype=torch.long)", 1,
             ["in %s has parameter 0.weight of dtype bfloat16" % (path % "bf16"), "gloo"]),
            ("unused", "Unused()", "torch.zeros(8, 32)", "torch.zeros(8, dtype=torch.long)", 1,
             ["leaves parameters spare.weight, spare.bias unused", "find_unused_parameters"])):
        open(path % name, "w").write(MISMATCH % (model, x, y))
        err = refused(name, 'module: "%s.py"' % name, workers=workers)
        # Whichever rank says it first ends the job: either rank's line will do (2db33b1).
        where = any("workload.pytorch.module: model() and data(%d, %d) in %s" % (rank, workers, path % name) in err
                    for rank in range(workers))
        for fragment in fragments:
            check(fragment in err and (name == "bf16" or where), "%s: %r not in:\n%s" % (name, fragment, err))
        check("Traceback" not in json.load(open(os.path.join(out, name, "v", "status.json")))["error"],
              "%s: status error" % name)

    import torch
    if not torch.cuda.is_available():  # device "cuda" without a device: refused before any process group
        err = refused("cuda", 'module: "no_model.py" device: "cuda"')
        check('workload.pytorch.device: "cuda", but the torch' in err and 'set device: "cpu"' in err,
              "cuda: %s" % err)
        check("NCCL built in" not in err, "cuda: torch's own NCCL error, not the driver's:\n%s" % err)
    print("refusals: ok")


DIST_MODEL = '''
import torch
import torch.nn as nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        torch.distributed.get_rank()  # as SyncBatchNorm asks the process group: fails before there is one
        return self.fc(x)


def model():
    return Net()


def data(rank, world):
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 8, generator=g)
    y = torch.randint(0, 3, (64,), generator=g)
    y[::7] = -100  # cross_entropy's ignore_index: padding
    return (x, y), (x[:16], y[:16])
'''


def valid(tmp):
    """Valid models the driver's checks must let through: a forward that uses torch.distributed (the check forward
    runs before the process group: skipped, said once a rank), labels of cross_entropy's ignore_index (-100), and a
    module folder holding a file named as a standard module (tokenize.py), run from that folder: neither the working
    directory (PYTHONSAFEPATH) nor the module's folder (taken off sys.path before the ranks start) shadows it."""
    mods = os.path.join(tmp, "mods")
    os.makedirs(mods)
    open(os.path.join(mods, "dist_model.py"), "w").write(DIST_MODEL)
    open(os.path.join(mods, "tokenize.py"), "w").write('raise ImportError("a module folder\'s tokenize.py shadowed '
                                                        'the standard library\'s")\n')
    cfg = os.path.join(mods, "study.textproto")
    open(cfg, "w").write(study("dist", 'module: "dist_model.py" max_steps_per_epoch: 3', 'variants { name: "v" }'))
    out = os.path.join(tmp, "results")
    p = run([ARGS.terse, "run", cfg, "--out", out], cwd=mods)
    status, lines = folder(out, "dist", "v")
    check(status["state"] == "completed" and lines[-1]["step"] == 3, "valid: %s %s" % (status, lines))
    check("the check forward of model() on data() is skipped: the model's forward uses torch.distributed" in p.stderr,
          "valid: no word of the skipped check:\n%s" % p.stderr)
    print("valid: trained %d steps" % lines[-1]["step"])


ADAM_MODEL = '''
import json
import os
import torch
import torch.nn.functional as F

RANK = []
WEIGHTS = []  # the weight at each training forward: the first step's update is the difference of the first two
CALLS = []


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 3)

    def forward(self, x):
        if self.training:
            WEIGHTS.append(self.fc.weight.detach().clone())
        return self.fc(x)


def model():
    return Net()


def data(rank, world):
    RANK.append(rank)
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(32, 8, generator=g)
    return (x, torch.randint(0, 3, (32,), generator=g)), (x[:16], torch.randint(0, 3, (16,), generator=g))


def loss(output, labels):
    CALLS.append(output.requires_grad)
    # The check forward's, then each step's: WEIGHTS[1] is the broadcast start, WEIGHTS[2] after the first step.
    if len(WEIGHTS) >= 3:
        step = (WEIGHTS[2] - WEIGHTS[1]).abs()
        with open(os.path.join(os.path.dirname(__file__), "loss-rank%d.json" % RANK[0]), "w") as f:
            json.dump({"calls": len(CALLS), "least": step.min().item(), "most": step.max().item()}, f)
    return F.cross_entropy(output, labels) + 100.0
'''

VECTOR_LOSS = '''
import torch
import torch.nn.functional as F
def model():
    return torch.nn.Linear(8, 3)
def data(rank, world):
    x = torch.zeros(8, 8)
    return (x, torch.zeros(8, dtype=torch.long)), (x, torch.zeros(8, dtype=torch.long))
def loss(output, labels):
    return F.cross_entropy(output, labels, reduction="none")
'''


def optimizer_loss(tmp):
    open(os.path.join(tmp, "adam_model.py"), "w").write(ADAM_MODEL)
    cfg = os.path.join(tmp, "adam.textproto")
    lr = 0.05
    open(cfg, "w").write(study("adam", 'module: "adam_model.py" max_steps_per_epoch: 3', 'variants { name: "v" }',
                               optimizer="kind: ADAMW lr: %g beta2: 0.95 weight_decay: 0.01" % lr))
    out = os.path.join(tmp, "results")
    run([ARGS.terse, "run", cfg, "--out", out], cwd=tmp)
    status, lines = folder(out, "adam", "v")
    check(status["state"] == "completed" and lines[-1]["step"] == 3, "adam: %s %s" % (status, lines))
    # Adam's first update is lr x m / (sqrt(v) + eps) = lr x g / (|g| + eps): the learning rate for every weight with
    # a gradient, AdamW's decay (lr x 0.01 x w) aside. SGD's would be lr x g, as uneven as the gradient.
    for rank in (0, 1):
        seen = json.load(open(os.path.join(tmp, "loss-rank%d.json" % rank)))
        check(0.97 * lr < seen["least"] and seen["most"] < 1.03 * lr,
              "adam: rank %d's first step moved the weights by %s..%s, not by lr %g: not Adam"
              % (rank, seen["least"], seen["most"], lr))
        check(seen["calls"] >= 3, "adam: rank %d called loss() %d times" % (rank, seen["calls"]))
    # The module's loss is cross-entropy + 100: in training and in the evaluation.
    check(lines[-1]["train_loss"] > 100 and lines[-1]["test_loss"] > 100, "adam: losses not loss()'s: %s" % lines)
    config = open(os.path.join(out, "adam", "v", "config.textproto")).read()
    for field in ("kind: ADAMW", "beta1: 0.9", "beta2: 0.95", "eps: 1e-08", "find_unused_parameters: false"):
        check(field in config, "adam: config.textproto lacks %r:\n%s" % (field, config))

    open(os.path.join(tmp, "vector_loss.py"), "w").write(VECTOR_LOSS)
    cfg = os.path.join(tmp, "vector.textproto")
    open(cfg, "w").write(study("vector", 'module: "vector_loss.py"', 'variants { name: "v" }', workers=1))
    p = run([ARGS.terse, "run", cfg, "--out", out], cwd=tmp, expect_ok=False, timeout=300)
    check(p.returncode != 0 and "Traceback" not in p.stderr, "vector: %d\n%s" % (p.returncode, p.stderr))
    check("workload.pytorch.module: loss(output, labels) in %s returned Tensor[4] float32" % os.path.join(
        tmp, "vector_loss.py") in p.stderr and "the batch's mean (reduce a per-example loss with .mean()" in p.stderr,
        "vector: %s" % p.stderr)
    print("optimizer_loss: first step %s..%s at lr %g; train loss %.3f" % (seen["least"], seen["most"], lr,
                                                                            lines[-1]["train_loss"]))


UNUSED_BRANCH = '''
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.used = torch.nn.Linear(8, 3)
        self.spare = torch.nn.Linear(8, 3)
        self.calls = 0
    def forward(self, x):
        self.calls += 1
        # %s
        if %s:
            return self.used(x) + self.spare(x)
        return self.used(x)
def model():
    return Net()
def data(rank, world):
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(32, 8, generator=g)
    return (x, torch.randint(0, 3, (32,), generator=g)), (x[:16], torch.randint(0, 3, (16,), generator=g))
'''


# UNUSED_BRANCH's branch on rank 0 always, on rank 1 only on odd calls (the check forward is the first).
RANK1_SKIPS = (UNUSED_BRANCH.replace("def data(rank, world):\n", "def data(rank, world):\n    RANK[0] = rank\n")
               .replace("import torch\n", "import torch\nRANK = [0]\n", 1)
               % ("spare on rank 1's odd calls", "RANK[0] != 1 or self.calls % 2 == 1"))


def unused_parameters(tmp):
    open(os.path.join(tmp, "never.py"), "w").write(UNUSED_BRANCH % ("spare is never used", "False"))
    # The check forward is the first call: it takes the branch, the first step does not, the second does again.
    open(os.path.join(tmp, "sometimes.py"), "w").write(UNUSED_BRANCH % ("spare on odd calls", "self.calls % 2 == 1"))
    cfg = os.path.join(tmp, "unused.textproto")
    open(cfg, "w").write(study("unused", 'module: "never.py" max_steps_per_epoch: 3', """
variants { name: "plain" }
variants { name: "found" overrides { workload { pytorch { find_unused_parameters: true } } } }
variants { name: "sometimes" overrides { workload { pytorch { module: "sometimes.py" } } } }""",
                               extra='tcp { timeout: "20s" }'))
    out = os.path.join(tmp, "results")
    p = run([ARGS.terse, "run", cfg, "--out", out], cwd=tmp, expect_ok=False, timeout=300)
    check(p.returncode != 0, "unused: terse run succeeded:\n%s" % p.stdout)
    plain = json.load(open(os.path.join(out, "unused", "plain", "status.json")))
    check(plain["state"] == "failed" and "leaves parameters spare.weight, spare.bias unused" in plain["error"]
          and "set workload.pytorch.find_unused_parameters: true" in plain["error"], "plain: %s" % plain)
    status, lines = folder(out, "unused", "found")
    check(status["state"] == "completed" and lines[-1]["step"] == 3, "found: %s %s\n%s" % (status, lines, p.stderr))
    check("find_unused_parameters: true" in open(os.path.join(out, "unused", "found", "config.textproto")).read(),
          "found: config.textproto does not record the field")
    sometimes = json.load(open(os.path.join(out, "unused", "sometimes", "status.json")))
    check(sometimes["state"] == "failed" and sometimes["error"].find("workload.pytorch.find_unused_parameters: a step "
                                                                     "of the model left parameters without a gradient")
          >= 0, "sometimes: %s\n%s" % (sometimes, p.stderr))
    check("Traceback" not in p.stderr, "unused: a traceback:\n%s" % p.stderr)
    print("unused_parameters: %s" % sometimes["error"][:200])

    # Under terse launch, a step that skips the branch on rank 1 alone: rank 1 is refused naming the field, rank 0
    # fails in the collective rank 1 never joined. A failure of the variant on both, not a refusal of the workload
    # (train.py _TRAINING): both ranks run the next variant, where rank 1 alone skipped it and rank 0 waited for it.
    open(os.path.join(tmp, "rank1_skips.py"), "w").write(RANK1_SKIPS)
    cfg = os.path.join(tmp, "rank1_skips.textproto")
    open(cfg, "w").write(study("r1skips", 'module: "rank1_skips.py" max_steps_per_epoch: 4',
                               'variants { name: "v" } variants { name: "w" overrides { optimizer { lr: 0.1 } } }',
                               transport="TCP", extra='tcp { timeout: "20s" }'))
    p = run([ARGS.terse, "launch", "-n", "2", "--", ARGS.terse, "run", cfg, "--out", out], cwd=tmp, expect_ok=False,
            timeout=300)
    check(p.returncode != 0, "rank1_skips: terse launch succeeded:\n%s" % p.stdout)
    check("skipped" not in p.stderr, "rank1_skips: a rank skipped the next variant:\n%s" % p.stderr)
    for variant in ("v", "w"):
        status = json.load(open(os.path.join(out, "r1skips", variant, "status.json")))
        check(status["state"] == "failed" and not status["error"].startswith("skipped"),
              "rank1_skips: %s: %s\n%s" % (variant, status, p.stderr))
    check(p.stderr.count("workload.pytorch.find_unused_parameters: a step of the model left parameters") >= 2,
          "rank1_skips: rank 1 was not refused in both variants:\n%s" % p.stderr)
    print("unused_parameters: under terse launch both ranks ran both variants")


PROV_MODEL = """
import torch
import helpers
from pkg import width
def model():
    return torch.nn.Linear(width, 2)
def data(rank, world):
    return helpers.pairs(), helpers.pairs()
"""

PROV_HELPERS = """
import torch
def pairs():
    return torch.ones(8, 4), torch.zeros(8, dtype=torch.long)
"""


def provenance(tmp):
    mods = os.path.join(tmp, "mods")
    os.makedirs(os.path.join(mods, "pkg"))
    for name, text in (("model.py", PROV_MODEL), ("other.py", PROV_MODEL.replace("Linear(width, 2)",
                                                                              "Linear(width, 3)")),
                       ("helpers.py", PROV_HELPERS), ("pkg/__init__.py", "from .layers import width\n"),
                       ("pkg/layers.py", "width = 4\n")):
        open(os.path.join(mods, name), "w").write(text)
    os.symlink(mods, os.path.join(tmp, "link"))
    other_dir = os.path.join(tmp, "other")
    os.makedirs(other_dir)
    out = os.path.join(tmp, "results")
    main = os.path.realpath(os.path.join(mods, "model.py"))
    # a: relative to the config, run from another folder; b: the sibling edited, the module named absolute through a
    # link by a config elsewhere.
    for name, cfg, module in (("a", os.path.join(mods, "a.textproto"), "model.py"),
                              ("b", os.path.join(other_dir, "b.textproto"), os.path.join(tmp, "link", "model.py"))):
        if name == "b":
            with open(os.path.join(mods, "helpers.py"), "a") as f:
                f.write("# edited\n")
        open(cfg, "w").write(study(name, 'module: "%s" max_steps_per_epoch: 1' % module, 'variants { name: "v" }'))
        run([ARGS.terse, "run", cfg, "--out", out], cwd=other_dir)
    configs = {n: open(os.path.join(out, n, "v", "config.textproto")).read() for n in "ab"}
    provs = {n: json.load(open(os.path.join(out, n, "v", "provenance.json"))) for n in "ab"}
    # c: a's folder as a run of another module would have written it (a third training run would add nothing here).
    shutil.copytree(os.path.join(out, "a"), os.path.join(out, "c"))
    open(os.path.join(out, "c", "v", "config.textproto"), "w").write(
        configs["a"].replace('study: "a"', 'study: "c"').replace(main, os.path.realpath(os.path.join(mods,
                                                                                                   "other.py"))))
    for n in "ab":
        check('module: "%s"' % main in configs[n], "%s: the module by its canonical path %s:\n%s"
              % (n, main, configs[n]))
    # data() replaced the data set: the config claims none (test_subset was set in the config's data block).
    for field in ("dataset_dir", "train_subset", "test_subset"):
        check(field not in configs["a"], "a: config.textproto names data.%s:\n%s" % (field, configs["a"]))
    ha, hb = provs["a"]["hook"], provs["b"]["hook"]
    check(ha["module_sha256"] == hb["module_sha256"] and ha["module_files_sha256"] != hb["module_files_sha256"],
          "an edited sibling: module_sha256 stays, module_files_sha256 changes: %s, %s" % (ha, hb))
    check(sorted(provs["a"]["module_files"]) == ["helpers.py", "model.py", "pkg/__init__.py", "pkg/layers.py"]
          and provs["a"]["module_files"]["helpers.py"] != provs["b"]["module_files"]["helpers.py"],
          "module_files: %s, %s" % (provs["a"]["module_files"], provs["b"]["module_files"]))
    # Where the plugin came from: the build tree's, as a native run records it, not the --plugin-path the driver was
    # once handed every folder as.
    origins = {p["origin"] for n in "ab" for p in provs[n]["plugins"]}
    check(origins == {"build tree"}, "plugin origins %s" % origins)
    same = run([ARGS.terse, "compare", os.path.join(out, "a"), os.path.join(out, "b"), "--format", "csv"], cwd=tmp)
    check("different workloads" not in same.stderr, "one module, two paths: `terse compare` warned:\n%s" % same.stderr)
    shown = run([ARGS.terse, "compare", "--provenance", os.path.join(out, "a"), os.path.join(out, "b"), "--format",
                 "json"], cwd=tmp).stdout
    hooks = {r["study"]: r.get("hook") for r in json.loads(shown)["runs"]}
    check(hooks["a"] != hooks["b"] and "module_files_sha256=" in hooks["a"],
          "`terse compare --provenance` should show the edit: %s" % hooks)
    differ = run([ARGS.terse, "compare", os.path.join(out, "a"), os.path.join(out, "c"), "--format", "csv"], cwd=tmp)
    check("different workloads" in differ.stderr, "another module: `terse compare` did not warn:\n%s" % differ.stderr)
    print("provenance: %d module files, plugin from %s" % (len(provs["a"]["module_files"]), origins.pop()))


def agreement(tmp):
    """The TCP ranks' agreement before training (train.py, _agree_before_training), with the gather faked: three ranks,
    rank 1 failing for a reason that is no refusal (kind "") and rank 2 refused in its module (kind "module"). Every
    rank takes rank 1's kind, the failing ones keeping their own message, so that every rank's terse run skips alike
    (rank 2 skipped what its peers ran, before)."""
    sys.path.insert(0, os.path.join(os.path.dirname(ARGS.terse), "..", "python"))
    import torch
    import terse.train as train

    class FakeSpec:
        device = "cpu"

    reasons = {0: None, 1: RuntimeError("no data set on this host"),
               2: train.UserCodeError("data()", "m.py", ValueError("bad shard"))}

    def run(rank):
        """What rank `rank` raises, each rank's gather answering with every rank's (code, text)."""
        mine = reasons[rank]

        def fake_gather(tensor, world, group):
            rows = []
            for r in range(world):
                e = reasons[r]
                text = b"" if e is None else train._summary_line(e).encode()
                code = 0 if e is None else 1 + train._BEFORE_TRAINING_KINDS.index(train._kind(e))
                rows.append(torch.tensor([code, len(text)]) if tensor.dtype == torch.int64
                            else torch.tensor(list(text) + [0] * (tensor.numel() - len(text)), dtype=torch.uint8))
            return rows

        saved = train._all_gather
        train._all_gather = fake_gather
        try:
            train._agree_before_training(FakeSpec(), rank, 3, mine)
        except Exception as e:  # noqa: BLE001
            return e
        finally:
            train._all_gather = saved
        return None

    got = {r: run(r) for r in range(3)}
    for r, e in got.items():
        check(e is not None, "rank %d did not fail" % r)
        check(train._kind(e) == "", "rank %d's kind is %r, not rank 1's ''" % (r, train._kind(e)))
    check(isinstance(got[0], train.PeerRefused) and "rank 1 failed before training" in str(got[0])
          and "no data set on this host" in str(got[0]), "rank 0: %s" % got[0])
    check(got[2] is reasons[2] and "bad shard" in train._summary_line(got[2]), "rank 2: %s" % got[2])
    print("agreement: every rank takes rank 1's kind; rank 0 says %s" % got[0])
    # Once the ranks agreed and training started, a refusal on one rank (DDP's unfinished reduction, which names
    # find_unused_parameters) is a failure of the variant alone: its peers fail with a broken collective, kind "", and
    # every rank's terse run must skip alike.
    unfinished = train.WorkloadError("workload.pytorch.find_unused_parameters: a step left parameters unused")
    check(train._kind(unfinished) == "config", "before training: kind %r" % train._kind(unfinished))
    train._TRAINING = True
    try:
        check(train._kind(unfinished) == "", "in training: kind %r, not ''" % train._kind(unfinished))
    finally:
        train._TRAINING = False


# A module whose data() gives its examples as tensors or as Datasets of the same items (FORM chooses): the two must
# train alike, bit for bit, whether the DataLoader reads in the rank's process or in worker processes.
DATASETS = """
import os
import torch

FORM = %r


class Items(torch.utils.data.Dataset):
    def __init__(self, x, y):
        self.x, self.y = x, y

    def __len__(self):
        return len(self.y)

    def __getitem__(self, i):
        return self.x[i], int(self.y[i])  # a label as a Python int, as torchvision's datasets give it


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def data(rank, world):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(96, 12, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    test_x, test_y = torch.randn(40, 12, generator=g), torch.randint(0, 3, (40,), generator=g)
    mine = slice(rank, None, world)
    if FORM == "tensors":
        return (x[mine], y[mine]), (test_x, test_y)
    return Items(x[mine], y[mine]), Items(test_x, test_y)
"""

# What a Dataset can get wrong, each a module of its own: (name, the module's source, workers, loader_workers, the
# fragments of the one line that refuses it, or of the module's own error).
BAD_DATASETS = (
    ("iterable", """
import torch
class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        return iter([(torch.zeros(4), 0)] * 8)
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    return Stream(), (torch.zeros(4, 4), torch.zeros(4, dtype=torch.long))
""", 1, 0, ["the train set is", "an IterableDataset; the driver needs a map-style Dataset"]),
    ("pil", """
import torch
class Picture:  # what a torchvision dataset gives without transforms.ToTensor(): not something to collate
    pass
class Pictures(torch.utils.data.Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return Picture(), 0
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    return Pictures(), Pictures()
""", 1, 0, ["the first 4 items of the train Dataset (item 0: (terse_user_model.Picture, int)) do not collate",
            "default_collate", "ToTensor()"]),
    ("triples", """
import torch
class Triples(torch.utils.data.Dataset):
    def __len__(self):
        return 8
    def __getitem__(self, i):
        return torch.zeros(4), 0, "extra"
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    return Triples(), Triples()
""", 1, 0, ["item 0 of the train Dataset is (Tensor[4] float32, int, str); expected an (x, y) pair"]),
    ("late_label", """
import torch
class Late(torch.utils.data.Dataset):  # labels within the model's 2 classes for the first items only
    def __len__(self):
        return 16
    def __getitem__(self, i):
        return torch.zeros(4), 0 if i < 4 else 7
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    return Late(), (torch.zeros(4, 4), torch.zeros(4, dtype=torch.long))
""", 1, 2, ["of the train Dataset holds labels", "but the model's forward gives 2 class scores an example"]),
    ("raises", """
import torch
class Broken(torch.utils.data.Dataset):
    def __len__(self):
        return 16
    def __getitem__(self, i):
        if i >= 4:
            raise ValueError("cannot read item %d" % i)
        return torch.zeros(4), 0
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    return Broken(), (torch.zeros(4, 4), torch.zeros(4, dtype=torch.long))
""", 1, 1, ["the train Dataset (data(rank, world)'s train, read by a DataLoader with 1 loader worker)",
            "raised ValueError: cannot read item"]),
    ("workers_for_tensors", """
import torch
def model():
    return torch.nn.Linear(4, 2)
def data(rank, world):
    return (torch.zeros(8, 4), torch.zeros(8, dtype=torch.long)), (torch.zeros(4, 4), torch.zeros(4, dtype=torch.long))
""", 1, 2, ["workload.pytorch.loader_workers: 2, but", "returned tensors"]),
)


def datasets(tmp):
    """data() returning Datasets: trained through DataLoaders bit for bit as the same items given as tensors, with no
    loader workers and with two; then each mistake of a Dataset refused in one line naming it, or, for the module's
    own __getitem__ failing in a loader worker, the module's error in the status."""
    for form in ("tensors", "datasets"):
        open(os.path.join(tmp, form + ".py"), "w").write(DATASETS % form)
    cfg = os.path.join(tmp, "study.textproto")
    open(cfg, "w").write(study("ds", 'module: "tensors.py"', """
variants { name: "tensors" }
variants { name: "dataset" overrides { workload { pytorch { module: "datasets.py" } } } }
variants { name: "dataset-2-workers" overrides { workload { pytorch { module: "datasets.py" loader_workers: 2 } } } }
""", batch=8))
    out = os.path.join(tmp, "results")
    run([ARGS.terse, "run", cfg, "--out", out, "--set", "epochs=2", "--set", "eval.per_epoch=false", "--set",
         "eval.every_steps=2"], cwd=tmp)
    runs = {}
    for variant in ("tensors", "dataset", "dataset-2-workers"):
        status, lines = folder(out, "ds", variant)
        check(status["state"] == "completed", "%s: status %s" % (variant, status))
        runs[variant] = [(r["step"], r["test_accuracy"], r["test_loss"], r["train_loss"], r["test_examples"])
                         for r in lines]
    # 48 examples a rank, batch 8: 6 steps an epoch, 12 in all, a record every 2.
    check(len(runs["tensors"]) == 6 and runs["tensors"][-1][0] == 12 and runs["tensors"][-1][4] == 40,
          "tensors: %s" % runs["tensors"])
    for variant in ("dataset", "dataset-2-workers"):
        check(runs[variant] == runs["tensors"], "%s trained otherwise than tensors of the same items:\n%s\n%s"
              % (variant, runs[variant], runs["tensors"]))
    config = open(os.path.join(out, "ds", "dataset-2-workers", "config.textproto")).read()
    check("loader_workers: 2" in config, "config.textproto:\n%s" % config)
    print("datasets: 12 steps alike as tensors, as a Dataset, and through 2 loader workers")

    for name, source, workers, loader_workers, fragments in BAD_DATASETS:
        open(os.path.join(tmp, name + ".py"), "w").write(source)
        cfg = os.path.join(tmp, name + ".textproto")
        extra = "loader_workers: %d" % loader_workers if loader_workers else ""
        open(cfg, "w").write(study(name, 'module: "%s.py" %s' % (name, extra), 'variants { name: "v" }',
                                   workers=workers))
        p = run([ARGS.terse, "run", cfg, "--out", out], cwd=tmp, expect_ok=False, timeout=300)
        status = json.load(open(os.path.join(out, name, "v", "status.json")))
        check(p.returncode != 0 and status["state"] == "failed", "%s: %d, status %s" % (name, p.returncode, status))
        missing = [f for f in fragments if f not in status["error"]]
        check(not missing, "%s: the status lacks %s:\n%s\n%s" % (name, missing, status["error"], p.stderr))
        if name != "raises":  # the driver's refusals are one line; the module's own error has its traceback
            check("Traceback" not in p.stderr, "%s: a traceback for a refusal:\n%s" % (name, p.stderr))
        print("datasets: %s -> %s" % (name, status["error"][:150]))


def evaluate(tmp):
    """The evaluation of a sequence model's labels with padding (-100, cross_entropy's ignore_index): a model that gets
    every real label right has test accuracy 1 and the loss of the real labels alone, through cross-entropy and
    through a module's loss(); before, each padding label counted as a wrong prediction (accuracy 0.5 here)."""
    sys.path.insert(0, os.path.join(os.path.dirname(ARGS.terse), "..", "python"))
    import torch
    import torch.nn.functional as F
    import terse.train as train

    labels = torch.tensor([1, 2, -100, -100] * 64)
    # Scores that put 4 on the right class of every real label (and on class 0 for padding).
    scores = torch.zeros(len(labels), 3)
    scores[torch.arange(len(labels)), labels.clamp(min=0)] = 4.0

    class Given(torch.nn.Module):
        def forward(self, x):
            return scores[x.long()]

    test = train.TensorExamples(torch.arange(len(labels)), labels)
    real = labels != -100
    want_loss = F.cross_entropy(scores[real], labels[real]).item()
    for name, loss in (("cross-entropy", train._cross_entropy),
                       ("loss()", lambda out, y: F.cross_entropy(out.reshape(-1, 3), y.reshape(-1)))):
        accuracy, test_loss = train.evaluate(Given(), test, lambda x: x, torch.device("cpu"), loss, batch=100)
        check(accuracy == 1.0 and abs(test_loss - want_loss) < 1e-6,
              "%s: accuracy %s, loss %s; expected 1.0 and %s (padding counted)" % (name, accuracy, test_loss,
                                                                                   want_loss))
    print("evaluate: padding labels count in neither accuracy nor loss")


LOCAL_MODEL = '''
import torch


def model():
    torch.manual_seed(5)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 3))


def data(rank, world):
    g = torch.Generator().manual_seed(rank)
    x = torch.randn(96, 8, generator=g)
    y = (x[:, 0] > 0).long() + (x[:, 1] > 0).long()
    return (x, y), (x[:32], y[:32])
'''


def local_sgd(tmp):
    """local_sgd for workload pytorch (terse.torch.LocalSGD in the driver): 12 steps, evaluated after steps 5, 10
    and 12. dense exchanges every step; local-4 (start_step 2) twice in its gradient steps, then after steps 6 and
    10 of its grid and the evaluations' 5 and 12 (with the native runner's warning for step 5); Qsparse (top-k 10% +
    EF from the first step) after 4 and 8 of its grid and the evaluations' 5, 10 and 12 (warned of 5 and 10). The
    bytes follow, and the folders' configs hold the schedule. With step_trace, every folder holds both ranks' step
    traces: groups in the gradient steps and the averagings only, and terse whatif replays each folder at 64
    workers on a slow network, where local-4's six exchanges cost less than dense's twelve."""
    mods = os.path.join(tmp, "mods")
    os.makedirs(mods)
    open(os.path.join(mods, "local_model.py"), "w").write(LOCAL_MODEL)
    cfg = os.path.join(mods, "study.textproto")
    open(cfg, "w").write(study("ls", 'module: "local_model.py" max_steps_per_epoch: 12', """
variants { name: "dense" }
variants { name: "local-4" overrides { local_sgd { period: 4 start_step: 2 } } }
variants {
  name: "qsparse-4"
  overrides {
    local_sgd { period: 4 }
    compressor { name: "topk" params { key: "ratio" value: "0.1" } }
    error_feedback: true
  }
}""", batch=8, extra="step_trace: true").replace("eval { per_epoch: true }", "eval { every_steps: 5 per_epoch: true }"))
    out = os.path.join(tmp, "results")
    p = run([ARGS.terse, "run", cfg, "--out", out], cwd=mods)
    runs = {v: folder(out, "ls", v) for v in ("dense", "local-4", "qsparse-4")}
    for v, (status, lines) in runs.items():
        check(status["state"] == "completed", "%s: status %s" % (v, status))
        check([r["step"] for r in lines] == [5, 10, 12], "%s: records at steps %s" % (v, [r["step"] for r in lines]))
    dense = [r["payload_bytes_per_worker"] for r in runs["dense"][1]]
    local = [r["payload_bytes_per_worker"] for r in runs["local-4"][1]]
    one = dense[0] // 5  # dense f32 exchanges are all alike, as are local-4's (compressor none)
    check(dense == [5 * one, 10 * one, 12 * one], "dense payloads %s" % dense)
    check(local == [3 * one, 5 * one, 6 * one], "local-4 payloads %s, expected %s" % (local, [3 * one, 5 * one,
                                                                                                6 * one]))
    qsparse = [r["payload_bytes_per_worker"] for r in runs["qsparse-4"][1]]
    q = qsparse[0] // 2
    check(qsparse == [2 * q, 4 * q, 5 * q] and q < one,  # a tiny model: the headers weigh
          "qsparse-4 payloads %s: not 2, 4 and 5 top-k exchanges below a dense one (%d B)" % (qsparse, one))
    config = open(os.path.join(out, "ls", "local-4", "config.textproto")).read()
    check("local_sgd {" in config and "period: 4" in config and "start_step: 2" in config,
          "local-4's config.textproto:\n%s" % config)
    check("warning: [local-4] 1 evaluation point falls between the averagings of local_sgd.period 4" in p.stderr
          and "[qsparse-4] 2 evaluation points fall" in p.stderr and "[dense]" not in p.stderr,
          "terse run's warnings:\n%s" % p.stderr)
    # Step traces: the steps that exchanged (numbered from 0) hold groups, the others none.
    exchanged = {"dense": set(range(12)), "local-4": {0, 1, 4, 5, 9, 11}, "qsparse-4": {3, 4, 7, 9, 11}}
    mean = {}
    for v, steps in exchanged.items():
        for rank in range(2):
            lines = open(os.path.join(out, "ls", v, "steps.rank%d.jsonl" % rank)).read().splitlines()
            grouped = {json.loads(x)["step"] for x in lines[1:] if json.loads(x)["groups"]}
            check(len(lines) == 13 and grouped == steps, "%s rank %d: %d steps, groups in steps %s, expected %s"
                  % (v, rank, len(lines) - 1, sorted(grouped), sorted(steps)))
        replay = run([ARGS.terse, "whatif", os.path.join(out, "ls", v), "--workers", "64", "--bandwidth", "100Kbps",
                      "--latency", "1us", "--json", "-"], cwd=tmp).stdout
        mean[v] = json.loads(replay[replay.index("\n{") + 1:])["mean_step_s"]
    # A model of 195 parameters on a link slow enough that its 780 B take about 120 ms a collective, so that the
    # host's Python between two steps (a few ms on a busy host) weighs little: dense's twelve allreduces against
    # local-4's six (and the small finiteness check before each of its four averagings).
    check(mean["local-4"] < 0.75 * mean["dense"], "whatif at 64 workers: %s" % mean)
    print("local_sgd: payload per worker dense %d, local-4 %d, qsparse-4 %d B; at 64 workers %s" % (
        dense[-1], local[-1], qsparse[-1], ", ".join("%s %.2f ms" % (v, 1e3 * m) for v, m in mean.items())))


def noniid(tmp):
    """data.partition DIRICHLET for a torchvision model on Fashion-MNIST: the driver trains on the native run's shards
    and its folder's provenance.json records the split as a native run of the same data records it (the driver's
    order over them: ddp_hook.provenance). A module's data and synthetic labels are refused by the config's
    validation, before any driver starts."""
    data = ('data { batch_size: 8 train_subset: 400 test_subset: 40 partition: DIRICHLET dirichlet_alpha: 0.1 '
            'partition_seed: 5 }')
    body = """workers: 2
mode: SYNC
compressor { name: "none" }
epochs: 1
seed: 3
%s
""" % data
    cfg = os.path.join(tmp, "noniid.textproto")
    open(cfg, "w").write('study: "noniid"\nworkload { name: "pytorch" pytorch { torchvision: "resnet18" image_size: 32 '
                         'channels: 3 max_steps_per_epoch: 2 } }\nclock: REAL_TIME\noptimizer { lr: 0.01 }\n' + body)
    native_cfg = os.path.join(tmp, "native.textproto")
    open(native_cfg, "w").write('study: "native"\nworkload { name: "mlp" hidden_sizes: [8] }\n' + body)
    out = os.path.join(tmp, "results")
    run([ARGS.terse, "run", cfg, "--out", out], cwd=tmp)
    run([ARGS.terse, "run", native_cfg, "--out", out], cwd=tmp)
    status, lines = folder(out, "noniid", "base")
    check(status["state"] == "completed" and lines[-1]["step"] == 2, "noniid: %s %s" % (status, lines))
    torch_run = json.load(open(os.path.join(out, "noniid", "base", "provenance.json"))).get("data_partition")
    native = json.load(open(os.path.join(out, "native", "base", "provenance.json")))["data_partition"]
    check(torch_run == native and native["kind"] == "dirichlet" and native["seed"] == "5",
          "the PyTorch run's data_partition %s, the native run's %s" % (torch_run, native))
    config = open(os.path.join(out, "noniid", "base", "config.textproto")).read()
    check("partition: DIRICHLET" in config and "dirichlet_alpha: 0.1" in config, "config.textproto:\n%s" % config)
    for workload, fragment in (
            ('pytorch { module: "m.py" }', "data.partition DIRICHLET with workload.pytorch.module: its data(rank, "
                                           "world) gives each rank its own data"),
            ('pytorch { torchvision: "resnet18" data: SYNTHETIC }', "data.partition DIRICHLET with "
                                                                   "workload.pytorch.data SYNTHETIC")):
        open(os.path.join(tmp, "m.py"), "w").write("def model(): pass\ndef data(rank, world): pass\n")
        bad = os.path.join(tmp, "bad.textproto")
        open(bad, "w").write('study: "bad"\nworkload { name: "pytorch" %s }\nclock: REAL_TIME\n%s' % (workload, body))
        p = run([ARGS.terse, "run", bad, "--out", out], cwd=tmp, expect_ok=False)
        check(p.returncode != 0 and fragment in p.stderr and not os.path.exists(os.path.join(out, "bad")),
              "%s: terse run said (%d):\n%s" % (workload, p.returncode, p.stderr))
    print("noniid: worker histograms %s / %s" % (native["worker0"], native["worker1"]))


def main():
    global ARGS
    p = argparse.ArgumentParser()
    p.add_argument("case", choices=["inproc", "tcp", "failures", "refusals", "valid", "optimizer_loss",
                                    "unused_parameters", "provenance", "agreement", "datasets", "evaluate",
                                    "local_sgd", "noniid"])
    p.add_argument("--terse", required=True)
    p.add_argument("--source", required=True)
    p.add_argument("--fixture-dir", required=True, help="tests/fixtures' plugins (misbehave)")
    ARGS = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        {"inproc": inproc, "tcp": tcp, "failures": failures, "refusals": refusals, "valid": valid,
         "optimizer_loss": optimizer_loss, "unused_parameters": unused_parameters,
         "provenance": provenance, "agreement": agreement, "datasets": datasets,
         "evaluate": evaluate, "local_sgd": local_sgd, "noniid": noniid}[ARGS.case](tmp)
    print("%s: ok" % ARGS.case)


if __name__ == "__main__":
    main()
