"""Where the package's own plugins are: the plugin path every entry point of the package searches."""

import os

# Where a pip-installed package keeps the built-in plugins (experiments/python/pyproject.toml). A wheel's loader has no
# build tree or install folder to fall back on, so this folder is passed as the last plugin_path entry: after the
# caller's, and so before TERSE_PLUGIN_PATH. The built-in plugins are then those built with this extension; a plugin of
# another name on TERSE_PLUGIN_PATH is still found, one of the same name is shadowed (the loader warns), and
# plugin_path= or a path replaces a built-in. The build tree's package has no such folder: its loader finds the build
# tree's plugins, as before.
PACKAGE_PLUGINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins")


def search_path(plugin_path):
    """The caller's folders (a path or a sequence of them), then the package's plugins when it has them."""
    if isinstance(plugin_path, (str, os.PathLike)):
        plugin_path = [plugin_path]
    dirs = [str(p) for p in plugin_path]
    if os.path.isdir(PACKAGE_PLUGINS):
        dirs.append(PACKAGE_PLUGINS)
    return dirs
