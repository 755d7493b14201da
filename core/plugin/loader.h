// Finding and loading plugin files (DESIGN.md section 3): a name from a config becomes a file in an ordered list of
// search directories; an argument that looks like a path is loaded as given. Every failure is a PluginError that names
// the file (or, for a missing name, every directory searched) and the reason; nothing falls back silently to another
// file, because a run with a different compressor than asked for would produce wrong results that look right.
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/plugin/compressor.h"
#include "core/plugin/compressor_plugin.h"
#include "core/plugin/plugin_info.h"
#include "core/plugin/scheduler.h"

namespace terse {

// Origins of search directories, in search order. They label the directories in messages and provenance.
inline constexpr std::string_view kOriginPluginPath = "--plugin-path";
inline constexpr std::string_view kOriginEnv = "TERSE_PLUGIN_PATH";
inline constexpr std::string_view kOriginBuildTree = "build tree";
inline constexpr std::string_view kOriginInstall = "install";
// The Python package's own plugins (a pip wheel's terse/plugins, beside the extension: packagePluginDirOf).
inline constexpr std::string_view kOriginPackage = "package";
inline constexpr std::string_view kOriginPath = "path";  // named by path, not found by search

struct SearchDir {
  std::filesystem::path dir;
  std::string origin;
  bool exists = false;  // whether it is a directory right now (refreshed by PluginLoader::searchDirs)
};

// The file a name resolved to, and the files of the same name later in the search order that lost to it.
struct PluginLocation {
  std::filesystem::path path;
  std::string origin;
  std::vector<std::pair<std::filesystem::path, std::string>> shadowed;  // (path, origin)
};

// One file found by PluginLoader::discover. A file that fails to load is an entry with `error` set, never an
// exception: one broken file must not hide the others from `terse plugins list`.
struct DiscoveredPlugin {
  PluginKind kind = PluginKind::kCompressor;
  std::string name;  // from the file name (terse_<kind>_<name>.so)
  std::filesystem::path path;
  std::string origin;
  std::optional<PluginInfo> info;  // when the file loaded
  std::string error;               // why it cannot be used by name (load error, name mismatch, invalid f32 caps)
  // Caps with no parameters: compressors for f32, schedulers their credit. Unset when instantiating without
  // parameters failed (see note) or the plugin does not handle f32.
  std::optional<CompressorCaps> compressor_caps;
  std::optional<SchedulerCaps> scheduler_caps;
  std::string note;  // e.g. "needs parameters: <init's message>", "f32: <unsupported message>"
  // The file of the same kind and name earlier in the search order, which loading by name picks instead.
  std::optional<std::filesystem::path> shadowed_by;
};

// Every plugin loaded through a loader, by (kind, name) and by file. The ABI makes names unique among loaded plugins:
// two files declaring one name would make results and provenance ambiguous, so that is an error naming both files.
// Loading one file twice returns the plugin loaded first. Thread-safe.
class PluginRegistry {
 public:
  std::shared_ptr<const CompressorPlugin> findCompressor(const std::filesystem::path& canonical_path) const;
  std::shared_ptr<const SchedulerPlugin> findScheduler(const std::filesystem::path& canonical_path) const;
  // Registers `plugin` and returns it, or the plugin already registered for the same file. Throws PluginError when a
  // different file already declared the same name.
  std::shared_ptr<const CompressorPlugin> add(std::shared_ptr<const CompressorPlugin> plugin);
  std::shared_ptr<const SchedulerPlugin> add(std::shared_ptr<const SchedulerPlugin> plugin);
  // What was loaded, for provenance: compressors then schedulers, each by name.
  std::vector<PluginInfo> loaded() const;

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const CompressorPlugin>> compressors_;  // by declared name
  std::map<std::string, std::shared_ptr<const SchedulerPlugin>> schedulers_;
};

class PluginLoader {
 public:
  // Search order for a name: the --plugin-path entries, the Python package's own plugins when the loader runs in a
  // pip-installed extension (packagePluginDirOf), TERSE_PLUGIN_PATH (read now, colon-separated), the plugins of
  // the installation this code belongs to (origin "install"), then, when this code is of the build tree
  // (belongsToBuildTree), the build tree's plugin directory. The
  // installation's are, when the loader is linked into a shared object that python3 or another program loaded (the
  // extension terse._terse), installPluginDirOf(that object), else <dir of the running executable>/../<plugin subdir>
  // (both relative to a file, so an installed tree can be moved; the executable's folder says nothing of where an
  // extension's terse is installed). Empty entries are skipped rather than meaning "the
  // current directory" as in PATH: a plugin must never be picked up from wherever the user happens to stand. A
  // directory listed twice is searched once, at its first place.
  //
  // `plugin_path_name` is how the caller's own directories are given, for messages: the CLI's "--plugin-path" (the
  // default) or the Python package's "plugin_path=" keyword, so that an error names what its reader can pass. Their
  // origin (provenance, `terse plugins`) stays kOriginPluginPath. Each of them must be a folder: one that does not
  // exist or is not a folder throws InvalidArgument naming it and `plugin_path_name`, since a misspelt folder would
  // otherwise show up only later as a plugin "not found", or never, when a folder further on holds one of the same
  // name. A TERSE_PLUGIN_PATH entry that is not a folder is logged as a warning instead: an environment carries stale
  // entries from other shells and projects, which should not stop every command.
  PluginLoader();
  // Each argument may hold several directories separated by ':' (as --plugin-path a:b or repeated --plugin-path).
  explicit PluginLoader(const std::vector<std::string>& plugin_path_args,
                        std::string plugin_path_name = std::string(kOriginPluginPath));
  // Directories taken as they are (a path may contain ':').
  explicit PluginLoader(const std::vector<std::filesystem::path>& plugin_dirs,
                        std::string plugin_path_name = std::string(kOriginPluginPath));
  // Exactly these directories, nothing from the environment or the build: for tests and embedding.
  static PluginLoader withSearchDirs(std::vector<SearchDir> dirs);
  // The search list the constructors build for `plugin_dirs` (--plugin-path), with `exists` filled.
  static std::vector<SearchDir> defaultSearchDirs(const std::vector<std::filesystem::path>& plugin_dirs);
  // The plugin directory of the installation that holds `object_file` (a shared object: the Python extension
  // terse._terse): <dir>/<plugin_subdir> for the nearest of the file's directory and its kMaxInstallDepth parents
  // where that is a directory, after resolving links; nullopt when there is none. An extension installed at
  // <prefix>/lib/python3.11/dist-packages/terse/ finds <prefix>/lib/terse/plugins four levels up. Looking for the
  // folder rather than stripping the configured package path off the file's directory keeps this room free of the
  // Python package's settings, and works for any place the package is installed to at that depth or less; the
  // nearest wins, and the walk stops at that depth, so an installation above the prefix is never taken for its own.
  static std::optional<std::filesystem::path> installPluginDirOf(const std::filesystem::path& object_file,
                                                                 const std::filesystem::path& plugin_subdir);
  // <prefix>/lib/python3.X/{dist,site}-packages/terse: the deepest place the package is installed to, below its prefix.
  static constexpr int kMaxInstallDepth = 4;
  // Whether `code_file` (the executable, or the shared object the loader is linked into) is of the build tree
  // `build_dir`, links resolved: it lies under build_dir, and the installation it belongs to (installPluginDirOf), if
  // it has one, is the build tree itself (<build_dir>/<plugin_subdir>), not a prefix installed into the tree. Only
  // then is the build tree's plugin folder searched: an installed terse, or an installed Python package, searches its
  // own installation and never the tree it was built in.
  static bool belongsToBuildTree(const std::filesystem::path& code_file, const std::filesystem::path& build_dir,
                                 const std::filesystem::path& plugin_subdir);
  // The folder of plugins a pip-installed package keeps beside its extension (`object_file`, after resolving links):
  // <its folder>/plugins where that is a directory, else nullopt. Searched after the caller's directories and before
  // TERSE_PLUGIN_PATH, with origin "package" (a wheel has no build tree or install folder to fall back on).
  static std::optional<std::filesystem::path> packagePluginDirOf(const std::filesystem::path& object_file);
  // Splits colon-separated --plugin-path arguments into directories, skipping empty entries.
  static std::vector<std::filesystem::path> splitPathList(std::string_view list);

  // The search directories in order, `exists` refreshed.
  std::vector<SearchDir> searchDirs() const;

  // An argument containing '/' or ending in ".so" is a path and loaded as given; anything else is a name.
  static bool isPathArgument(std::string_view name_or_path) noexcept;
  // "terse_compressor_<name>.so"
  static std::string fileNameFor(PluginKind kind, std::string_view name);

  // Resolves a name to a file (first match in search order wins; later matches are recorded as shadowed and logged as
  // a warning). Throws PluginError for an invalid name or when no search directory has the file, listing every
  // directory searched with its origin and whether it exists, and the names of that kind the directories hold (file
  // names only: nothing is loaded to say so).
  PluginLocation locate(PluginKind kind, std::string_view name) const;

  // Loads by name or by path, validates, and registers (see PluginRegistry). Loading by name also requires the
  // declared name to match the file name. Throws PluginError naming the file and the reason.
  std::shared_ptr<const CompressorPlugin> loadCompressor(std::string_view name_or_path);
  std::shared_ptr<const SchedulerPlugin> loadScheduler(std::string_view name_or_path);

  // Every terse_compressor_*.so and terse_scheduler_*.so in every existing search directory, in search order (file
  // names sorted within a directory), each tried on its own: nothing is registered, nothing throws.
  std::vector<DiscoveredPlugin> discover() const;

  PluginRegistry& registry() noexcept { return *registry_; }
  const PluginRegistry& registry() const noexcept { return *registry_; }

 private:
  struct DirsTag {};
  PluginLoader(DirsTag, std::vector<SearchDir> dirs, std::string plugin_path_name = std::string(kOriginPluginPath));

  template <typename PluginT>
  std::shared_ptr<const PluginT> load(PluginKind kind, std::string_view name_or_path);

  std::vector<SearchDir> dirs_;
  std::shared_ptr<PluginRegistry> registry_;  // shared so a loader stays movable
  std::string plugin_path_name_{kOriginPluginPath};
};

}  // namespace terse
