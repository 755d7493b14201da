"""terse from Python: the package's entry point.

terse is a C++ framework for communication-efficient distributed training; this package is its front end for
PyTorch, beside the `terse` command line. The work is done by the extension module terse._terse, which links terse's
own engine (plugin loader, codecs, error feedback and momentum correction, aggregation engine, results writer), so a
compressor behaves and fails here exactly as it does in `terse run`.

    terse.torch.CompressionState(...), terse.torch.compression_hook
                                a DistributedDataParallel communication hook (see terse/torch.py)
    terse.torch.LocalSGD, terse.torch.local_sgd_hook
                                local SGD, post-local SGD, DiLoCo's outer step and compressed averaging through a
                                CompressionState (see terse/local_sgd.py)
    terse.torch.ResultsLogger   a terse results folder for a PyTorch run
    terse.Recipe(path, variant) one variant of a terse experiment config: its data, initial parameters, batches and
                                learning rates, to train the same recipe in PyTorch as `terse run` does natively

Errors are terse's, with terse's messages: terse.Error (a RuntimeError) and its subclasses InvalidArgument (also a
ValueError), ConfigError, PluginError, Unsupported, InvalidPayload, CommError, InternalError.
"""

from ._terse import (  # noqa: F401  (re-exported)
    CommError,
    ConfigError,
    Error,
    InternalError,
    InvalidArgument,
    InvalidPayload,
    PluginError,
    Unsupported,
    __version__,
)
from . import _terse
from ._plugins import search_path as _search_path


class Recipe(_terse.Recipe):
    """One variant of a terse experiment config (experiments/python/recipe.h): Recipe(path, variant="",
    plugin_path=()). The plugin path is searched as terse.torch.CompressionState searches it: the given folders,
    then a pip-installed package's own plugins, then TERSE_PLUGIN_PATH, the installation's plugins and, for the build
    tree's package only, the build tree's.

    With data.partition DIRICHLET, batches(rank, world_size, epoch) and data_partition(world_size) split the data for
    `world_size` workers: the native run splits it for the config's `workers`, so the two train the same shards only
    where world_size equals workers."""

    def __init__(self, path, variant="", plugin_path=()):
        super().__init__(str(path), str(variant), _search_path(plugin_path))
