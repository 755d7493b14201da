"""Run by tests/install (CASE=python): the installed terse package, imported from its prefix, loads plugins.

usage: installed_package.py PREFIX CONFIG_DIR

CONFIG_DIR holds three configs: extra.textproto names a compressor that only PREFIX's plugin folder holds,
builtin.textproto names topk, and missing.textproto one that no folder holds, whose error (printed) lists every
folder searched with its origin, for the caller to check against the folders it knows. Then a ResultsLogger (a
one-process gloo group) writes a results folder in CONFIG_DIR, and its git_commit is printed ("git_commit: ..."), for
the caller to check against the commit terse was built from.
"""

import json
import os
import sys

prefix, configs = sys.argv[1], sys.argv[2]

import terse  # noqa: E402
import terse._terse as ext  # noqa: E402

# The prefix's package, not the build tree's.
where = os.path.realpath(ext.__file__)
if not where.startswith(os.path.realpath(prefix) + os.sep):
    sys.exit(f"terse._terse was imported from {where}, not from {prefix}")
print(f"terse._terse: {where}")

for name in ("extra", "builtin"):
    recipe = terse.Recipe(os.path.join(configs, name + ".textproto"))
    print(f"{name}: loads compressor {recipe.experiment['compressor']['name']}")

try:
    terse.Recipe(os.path.join(configs, "missing.textproto"))
except terse.Error as e:
    print(f"missing: {e}")
else:
    sys.exit("missing: loaded a compressor that no plugin folder holds")

# The commit a results folder names: the one the package was built from (results/build_commit.h), whatever repository
# holds the installation or the working directory (the caller made CONFIG_DIR, which holds both, one of its own).
import torch.distributed as dist  # noqa: E402

import terse.torch  # noqa: E402

dist.init_process_group("gloo", init_method="file://" + os.path.join(configs, "store"), rank=0, world_size=1)
try:
    log = terse.torch.ResultsLogger(os.path.join(configs, "results"), study="installed", bytes_per_step=4)
    log.record(test_accuracy=0.5, step=1)
    log.finish()
    with open(os.path.join(log.results_dir, "provenance.json")) as f:
        print("git_commit: " + json.load(f)["git_commit"])
finally:
    dist.destroy_process_group()
