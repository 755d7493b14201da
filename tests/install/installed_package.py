"""Run by tests/install (CASE=python): the installed terse package, imported from its prefix, loads plugins.

usage: installed_package.py PREFIX CONFIG_DIR

CONFIG_DIR holds three configs: extra.textproto names a compressor that only PREFIX's plugin folder holds,
builtin.textproto names topk, and missing.textproto one that no folder holds, whose error (printed) lists every
folder searched with its origin, for the caller to check against the folders it knows.
"""

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
