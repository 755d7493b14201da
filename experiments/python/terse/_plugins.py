"""Where the package's own plugins are: the plugin path every entry point of the package searches."""

import os

# Where a pip-installed package keeps the built-in plugins (experiments/python/pyproject.toml). The loader finds this
# folder itself, beside the extension (core/plugin/loader.h, packagePluginDirOf: origin "package"), after the caller's
# folders and before TERSE_PLUGIN_PATH. The built-in plugins are then those built with this extension; a plugin of
# another name on TERSE_PLUGIN_PATH is still found, one of the same name is shadowed (the loader warns), and
# plugin_path= or a path replaces a built-in. The build tree's package has no such folder: its loader finds the build
# tree's plugins, as before.
PACKAGE_PLUGINS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plugins")


def search_path(plugin_path):
    """The caller's folders (a path or a sequence of them)."""
    if isinstance(plugin_path, (str, os.PathLike)):
        plugin_path = [plugin_path]
    return [str(p) for p in plugin_path]
