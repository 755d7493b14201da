#!/usr/bin/env python3
"""`pip install experiments/python` as a user runs it, then terse.torch from the installed package alone.

In a fresh venv (--system-site-packages, so the interpreter's torch is the one used), pip builds the wheel with
scikit-build-core (--no-build-isolation: no download but scikit-build-core itself, when the interpreter has none) and
installs it. Then, from a folder outside the source tree, with no PYTHONPATH and TERSE_PLUGIN_PATH empty, a process
imports terse.torch, builds a CompressionState for a built-in compressor on a one-process gloo group, runs one DDP
step through the hook, and checks that the plugin came from the installed package's terse/plugins, that the
installed extension links no libtorch, and that a ResultsLogger's provenance.json names the commit the package was
built from (`git rev-parse HEAD` of the source, with "-dirty" when its tracked files have changes, as `terse run`
records it), not "unknown": the installed extension's folder is no checkout, so only its build can know.

Exit 77 (ctest's skip) when scikit-build-core cannot be installed from the package index (no network).

The wheel's build folder is kept (--build-dir), so a second run rebuilds nothing; the CMake settings the build tree
compiled with (--defines) are passed on, so its compiler commands are the build tree's and ccache serves the objects
the build tree compiled (tests/python/CMakeLists.txt says where the folder goes, and why there).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

SKIP = 77


def run(cmd, log=None, **kw):
    """Runs cmd; with log, its output goes there instead of the console."""
    if log is None:
        return subprocess.run(cmd, **kw).returncode
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kw).returncode


def tail(path, lines=60):
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-lines:])


def clean_env():
    """The environment of a user who has only pip-installed terse: nothing pointing into a source or build tree."""
    env = dict(os.environ)
    for key in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP", "PYTHONUSERBASE"):
        env.pop(key, None)
    env["TERSE_PLUGIN_PATH"] = ""
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PIP_NO_INPUT"] = "1"
    return env


def install(args):
    env = clean_env()
    os.makedirs(args.build_dir, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="terse-pip-") as tmp:
        venv = os.path.join(tmp, "venv")
        if run([sys.executable, "-m", "venv", "--system-site-packages", venv], env=env):
            print("pip_install_test: `%s -m venv` failed (Debian: apt-get install python3-venv)" % sys.executable)
            return 1
        py = os.path.join(venv, "bin", "python")

        if run([py, "-c", "import scikit_build_core"], env=env, stderr=subprocess.DEVNULL):
            log = os.path.join(tmp, "pip-scikit-build-core.log")
            if run([py, "-m", "pip", "install", "--timeout", "20", "--retries", "1", "scikit-build-core>=0.10"],
                   log=log, env=env):
                print(tail(log, 20))
                print("pip_install_test: SKIP: scikit-build-core, the package's build backend, is not installed and "
                      "pip could not install it from the package index (no network?)")
                return SKIP

        cmd = [py, "-m", "pip", "install", "-v", "--no-build-isolation", "--no-index", "--no-deps",
               "--config-settings", "build-dir=" + args.build_dir]
        if args.build_type:
            cmd += ["--config-settings", "cmake.build-type=" + args.build_type]
        if args.defines:
            with open(args.defines) as f:
                for line in f:
                    line = line.rstrip("\n")
                    if line:
                        cmd += ["--config-settings", "cmake.define." + line]
        cmd.append(os.path.join(args.source, "experiments", "python"))
        log = os.path.join(args.build_dir, "pip-install.log")
        start = time.monotonic()
        rc = run(cmd, log=log, env=env, cwd=tmp)
        took = time.monotonic() - start
        if rc:
            print(tail(log))
            print("pip_install_test: pip install failed after %.0f s (log: %s)" % (took, log))
            return 1
        print("pip_install_test: pip install took %.0f s (build folder %s, log %s)" % (took, args.build_dir, log))

        # The check runs isolated (-I: no script folder, no PYTHON* variables, no user site) from a folder of its own.
        cwd = os.path.join(tmp, "elsewhere")
        os.mkdir(cwd)
        return run([py, "-I", os.path.abspath(__file__), "check", "--source", args.source, "--readelf", args.readelf,
                    "--store", os.path.join(tmp, "store"), "--results", os.path.join(tmp, "results")], env=env,
                   cwd=cwd)


def inside(path, folder):
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return os.path.commonpath([path, folder]) == folder


def source_commit(source):
    """What a build of `source` records as git_commit (results/build_commit.h, taken when it is built, as the wheel was
    just now): HEAD, "-dirty" when tracked files have changes; "unknown" when `source` is not the top of a git
    checkout."""
    def git(*cmd):
        r = subprocess.run(["git", "-C", source] + list(cmd), capture_output=True, text=True)
        return r.stdout if r.returncode == 0 else None

    out = git("rev-parse", "--show-toplevel", "HEAD")
    lines = out.split() if out else []
    if len(lines) != 2 or os.path.realpath(lines[0]) != os.path.realpath(source):
        return "unknown"
    status = git("status", "--porcelain", "--untracked-files=no")
    return lines[1] + ("-dirty" if status else "")


def check(args):
    import torch
    import torch.distributed as dist

    import terse
    import terse.torch

    failures = []

    def expect(cond, message):
        if not cond:
            failures.append(message)

    package = os.path.dirname(os.path.realpath(terse.__file__))
    plugins = os.path.join(package, "plugins")
    print("terse %s from %s; torch %s" % (terse.__version__, package, torch.__version__))
    expect(inside(package, sys.prefix), "terse was imported from %s, not from the venv %s" % (package, sys.prefix))
    expect(not inside(package, args.source), "terse was imported from the source tree (%s)" % package)
    expect(os.environ.get("TERSE_PLUGIN_PATH") == "" and "PYTHONPATH" not in os.environ,
           "the check runs with TERSE_PLUGIN_PATH set or PYTHONPATH: %r %r"
           % (os.environ.get("TERSE_PLUGIN_PATH"), os.environ.get("PYTHONPATH")))
    names = sorted(os.listdir(plugins)) if os.path.isdir(plugins) else []
    print("terse/plugins: %s" % " ".join(names))
    for name in ("terse_compressor_topk.so", "terse_compressor_powersgd.so", "terse_scheduler_fifo.so"):
        expect(name in names, "%s is not in the installed package's plugins folder %s" % (name, plugins))

    extension = terse._terse.__file__
    dynamic = subprocess.run([args.readelf, "-d", extension], capture_output=True, text=True, check=True).stdout
    needed = re.findall(r"\(NEEDED\).*\[([^\]]+)\]", dynamic)
    print("%s needs: %s" % (os.path.basename(extension), ", ".join(needed)))
    expect(needed, "no NEEDED entries in `readelf -d %s`" % extension)
    expect(not [n for n in needed if re.match(r"lib(torch|c10|shm)[._]", n)],
           "the installed extension links libtorch: %s" % needed)

    dist.init_process_group("gloo", init_method="file://" + args.store, rank=0, world_size=1)
    try:
        state = terse.torch.CompressionState("topk", ratio=0.25)
        print("plugin: %s" % state.plugin)
        expect(inside(state.plugin["path"], plugins),
               "topk was loaded from %s, not from the installed package's %s" % (state.plugin["path"], plugins))
        expect(state.plugin["origin"] == "package",
               "the package's own plugin was recorded as found via %r, not 'package'" % (state.plugin["origin"],))
        model = torch.nn.Linear(16, 4)
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        ddp.register_comm_hook(state, terse.torch.compression_hook)
        ddp(torch.randn(8, 16)).square().sum().backward()
        expect(state.step == 1, "one DDP step through the hook, but the state counted %d" % state.step)
        expect(all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters()),
               "the hook left a gradient unset or not finite")
        # Every module of the package is installed: terse.torch.LocalSGD comes from terse/local_sgd.py.
        local = terse.torch.LocalSGD(terse.torch.CompressionState("none", module=model), model, period=1)
        expect(local.step() and local.averagings == 1, "LocalSGD did not average at period 1")

        # The installed package's results name the commit it was built from. The check runs from a folder outside
        # any checkout, so what git says at run time cannot stand in for it.
        log = terse.torch.ResultsLogger(args.results, study="pip", state=state)
        log.record(test_accuracy=0.5)
        log.finish()
        with open(os.path.join(log.results_dir, "provenance.json")) as f:
            recorded = json.load(f)["git_commit"]
        expected = source_commit(args.source)
        print("git_commit: %s (the source: %s)" % (recorded, expected))
        expect(recorded == expected, "the installed package's results record git_commit %r, but it was built from %r"
               % (recorded, expected))
        expect(expected == "unknown" or re.fullmatch(r"[0-9a-f]{40}(-dirty)?", recorded),
               "git_commit %r is not a commit" % (recorded,))
    finally:
        dist.destroy_process_group()

    for f in failures:
        print("FAIL: " + f)
    print("pip_install_test: %s" % ("FAILED" if failures else "installed package works"))
    return 1 if failures else 0


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", nargs="?", choices=("install", "check"), default="install")
    p.add_argument("--source", required=True, help="the repository root")
    p.add_argument("--build-dir", help="scikit-build-core's build folder, kept between runs")
    p.add_argument("--build-type", help="CMAKE_BUILD_TYPE")
    p.add_argument("--defines", help="a file of NAME=VALUE lines, each passed as --config-settings "
                   "cmake.define.NAME=VALUE")
    p.add_argument("--readelf", default="readelf")
    p.add_argument("--store", help="(check) the gloo group's file store")
    p.add_argument("--results", help="(check) the ResultsLogger's root folder")
    args = p.parse_args()
    if args.mode == "check":
        return check(args)
    if not args.build_dir:
        p.error("--build-dir is required")
    return install(args)


if __name__ == "__main__":
    sys.exit(main())
