#include "core/plugin/loader.h"

#include <dlfcn.h>
#include <link.h>

#include <algorithm>
#include <cstdlib>
#include <set>
#include <sstream>
#include <system_error>

#include "core/common/error.h"
#include "core/common/log.h"
#include "core/plugin/plugin_support.h"

namespace terse {
namespace fs = std::filesystem;

namespace {

bool isDirectory(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec);
}

bool isRegularFile(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec);  // follows symlinks: a link to a plugin is a plugin
}

// The identity used to drop a directory listed twice (e.g. --plugin-path naming the build tree).
fs::path identity(const fs::path& p) {
  std::error_code ec;
  fs::path out = fs::weakly_canonical(p, ec);
  return ec ? p.lexically_normal() : out;
}

// The running executable, not the current directory or argv[0]: a moved or symlinked install still finds the
// plugins it was installed with.
std::optional<fs::path> runningExecutable() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec || exe.empty()) return std::nullopt;
  return exe;
}

std::optional<fs::path> installPluginDir() {
#ifdef TERSE_PLUGIN_SUBDIR
  const auto exe = runningExecutable();
  if (!exe) return std::nullopt;
  return (exe->parent_path() / ".." / TERSE_PLUGIN_SUBDIR).lexically_normal();
#else
  return std::nullopt;
#endif
}

// The file of the shared object this loader was linked into, when that is not the main program: the Python extension
// terse._terse, loaded into python3, whose own installation holds the plugins it was installed with. nullopt in the
// main program (`terse`, the tests), whose directory installPluginDir() covers.
std::optional<fs::path> loaderObjectFile() {
  Dl_info info{};
  void* extra = nullptr;
  if (dladdr1(reinterpret_cast<void*>(&loaderObjectFile), &info, &extra, RTLD_DL_LINKMAP) == 0) return std::nullopt;
  // The main program's link map has an empty name (dli_fname is then argv[0], which need not be a path).
  const auto* map = static_cast<const link_map*>(extra);
  if (map == nullptr || map->l_name == nullptr || map->l_name[0] == '\0') return std::nullopt;
  return fs::path(map->l_name);
}

std::string quotedPath(const fs::path& p) {
  return "'" + p.string() + "'";
}

// Why `p`, named as a folder of plugins, is not one.
std::string_view whyNotAFolder(const fs::path& p) {
  if (isRegularFile(p)) return "is a file, not a folder";
  std::error_code ec;
  return fs::exists(p, ec) ? "is not a folder" : "does not exist";
}

// The same, and what to give instead.
std::string notAFolder(const fs::path& p) {
  return std::string(whyNotAFolder(p)) +
         (isRegularFile(p)
              ? ": give the plugin's file as its name, or its folder here"
              : ": give a folder that holds terse_compressor_<name>.so or terse_scheduler_<name>.so files");
}

// The search list for a message; `plugin_path_name` labels the caller's own directories as the caller gives them.
std::string describeDirs(const std::vector<SearchDir>& dirs, std::string_view plugin_path_name) {
  std::ostringstream o;
  if (dirs.empty()) o << "\n  (no search directories)";
  for (const auto& d : dirs) {
    // A file given where a folder is searched (the plugin's own path as a plugin path, say) is not "missing".
    const char* const absent = isRegularFile(d.dir) ? ", a file, not a folder: give the plugin's file as its name, or "
                                                      "its folder here"
                                                    : ", does not exist";
    o << "\n  " << d.dir.string() << " (" << (d.origin == kOriginPluginPath ? plugin_path_name : d.origin)
      << (d.exists ? "" : absent) << ")";
  }
  return o.str();
}

std::string kindPrefix(PluginKind kind) {
  return "terse_" + std::string(pluginKindName(kind)) + "_";
}

// The plugin names of `kind` that the existing directories hold, from their file names alone (sorted, each once):
// cheap enough for an error message, where loading each file to check it would not be.
std::set<std::string> namesIn(const std::vector<SearchDir>& dirs, PluginKind kind) {
  const std::string prefix = kindPrefix(kind);
  std::set<std::string> names;
  for (const auto& d : dirs) {
    if (!d.exists) continue;
    std::error_code ec;
    for (fs::directory_iterator it(d.dir, ec), end; !ec && it != end; it.increment(ec)) {
      const std::string f = it->path().filename().string();
      if (f.size() <= prefix.size() + 3 || !f.starts_with(prefix) || !f.ends_with(".so")) continue;
      const std::string name = f.substr(prefix.size(), f.size() - prefix.size() - 3);
      if (isValidPluginName(name)) names.insert(name);
    }
  }
  return names;
}

template <typename PluginT>
constexpr PluginKind kindOf();
template <>
constexpr PluginKind kindOf<CompressorPlugin>() {
  return PluginKind::kCompressor;
}
template <>
constexpr PluginKind kindOf<SchedulerPlugin>() {
  return PluginKind::kScheduler;
}

template <typename PluginT>
std::shared_ptr<const PluginT> findIn(const std::map<std::string, std::shared_ptr<const PluginT>>& by_name,
                                      const fs::path& path) {
  for (const auto& [name, plugin] : by_name)
    if (plugin->info().path == path) return plugin;
  return nullptr;
}

template <typename PluginT>
std::shared_ptr<const PluginT> addTo(std::map<std::string, std::shared_ptr<const PluginT>>& by_name,
                                     std::shared_ptr<const PluginT> plugin) {
  const PluginInfo& info = plugin->info();
  if (auto same_file = findIn(by_name, info.path)) return same_file;
  auto [it, inserted] = by_name.emplace(info.name, plugin);
  if (!inserted) {
    TERSE_THROW(PluginError, "two plugins with one name: " << pluginKindName(info.kind) << " '" << info.name
                                                           << "' is already loaded from "
                                                           << it->second->info().path.string() << ", and "
                                                           << info.path.string() << " declares the same name");
  }
  return plugin;
}

}  // namespace

// ---- PluginRegistry

std::shared_ptr<const CompressorPlugin> PluginRegistry::findCompressor(const fs::path& canonical_path) const {
  std::lock_guard lock(mutex_);
  return findIn(compressors_, canonical_path);
}

std::shared_ptr<const SchedulerPlugin> PluginRegistry::findScheduler(const fs::path& canonical_path) const {
  std::lock_guard lock(mutex_);
  return findIn(schedulers_, canonical_path);
}

std::shared_ptr<const CompressorPlugin> PluginRegistry::add(std::shared_ptr<const CompressorPlugin> plugin) {
  std::lock_guard lock(mutex_);
  return addTo(compressors_, std::move(plugin));
}

std::shared_ptr<const SchedulerPlugin> PluginRegistry::add(std::shared_ptr<const SchedulerPlugin> plugin) {
  std::lock_guard lock(mutex_);
  return addTo(schedulers_, std::move(plugin));
}

std::vector<PluginInfo> PluginRegistry::loaded() const {
  std::lock_guard lock(mutex_);
  std::vector<PluginInfo> out;
  for (const auto& [name, p] : compressors_) out.push_back(p->info());
  for (const auto& [name, p] : schedulers_) out.push_back(p->info());
  return out;
}

// ---- PluginLoader: search directories

std::vector<fs::path> PluginLoader::splitPathList(std::string_view list) {
  std::vector<fs::path> out;
  std::size_t start = 0;
  while (start <= list.size()) {
    const std::size_t end = std::min(list.find(':', start), list.size());
    if (end > start) out.emplace_back(std::string(list.substr(start, end - start)));
    start = end + 1;
  }
  return out;
}

std::vector<SearchDir> PluginLoader::defaultSearchDirs(const std::vector<fs::path>& plugin_dirs) {
  std::vector<SearchDir> dirs;
  for (const auto& d : plugin_dirs) dirs.push_back({fs::absolute(d), std::string(kOriginPluginPath)});
  if (const auto object = loaderObjectFile()) {
    if (auto d = packagePluginDirOf(*object)) dirs.push_back({std::move(*d), std::string(kOriginPackage)});
  }
  if (const char* env = std::getenv("TERSE_PLUGIN_PATH")) {
    for (const auto& d : splitPathList(env)) dirs.push_back({fs::absolute(d), std::string(kOriginEnv)});
  }
  // An installation's own plugins, and only an installation's: an installed terse uses the plugins installed with it,
  // never those of the tree it was built in (which may be newer, older or gone, and whose files of the same names
  // would only be reported as shadowed). Its own are found from the file that holds this code: the Python extension's
  // installation first when the loader runs inside one (python3's executable says nothing of where terse is
  // installed), else the running executable's. Inside an extension the executable's folder is not searched: it is
  // python3's (/usr/bin), whose ../lib/terse/plugins would be some other terse's, or nothing. The build tree's folder
  // is searched when that file is itself of the build tree (belongsToBuildTree); for such a file its installation
  // folder is the build tree's, searched once, as the build tree.
  std::vector<fs::path> own;
  const auto object = loaderObjectFile();
#ifdef TERSE_PLUGIN_SUBDIR
  if (object) {
    if (auto d = installPluginDirOf(*object, TERSE_PLUGIN_SUBDIR)) own.push_back(std::move(*d));
  }
#endif
  if (!object) {
    if (auto d = installPluginDir()) own.push_back(std::move(*d));
  }
#if defined(TERSE_BUILD_PLUGIN_DIR) && defined(TERSE_BUILD_DIR)
  const fs::path build(TERSE_BUILD_PLUGIN_DIR);
  for (auto& d : own)
    if (identity(d) != identity(build)) dirs.push_back({std::move(d), std::string(kOriginInstall)});
  const std::optional<fs::path> code_file = object ? object : runningExecutable();
  if (code_file && belongsToBuildTree(*code_file, TERSE_BUILD_DIR, TERSE_PLUGIN_SUBDIR))
    dirs.push_back({build, std::string(kOriginBuildTree)});
#else
  for (auto& d : own) dirs.push_back({std::move(d), std::string(kOriginInstall)});
#endif

  std::vector<SearchDir> unique;
  std::set<fs::path> seen;
  for (auto& d : dirs) {
    if (!seen.insert(identity(d.dir)).second) continue;
    d.exists = isDirectory(d.dir);
    unique.push_back(std::move(d));
  }
  return unique;
}

std::optional<fs::path> PluginLoader::installPluginDirOf(const fs::path& object_file, const fs::path& plugin_subdir) {
  // The object's real place: a link to an installed extension still finds the installation it belongs to.
  std::error_code ec;
  fs::path file = fs::weakly_canonical(object_file, ec);
  if (ec) file = object_file.lexically_normal();
  fs::path dir = fs::absolute(file, ec).parent_path();
  if (ec) return std::nullopt;
  for (int up = 0; up <= kMaxInstallDepth; ++up) {
    if (isDirectory(dir / plugin_subdir)) return (dir / plugin_subdir).lexically_normal();
    if (!dir.has_relative_path()) break;  // the root
    dir = dir.parent_path();
  }
  return std::nullopt;
}

bool PluginLoader::belongsToBuildTree(const fs::path& code_file, const fs::path& build_dir,
                                      const fs::path& plugin_subdir) {
  std::error_code ec;
  const fs::path file = fs::weakly_canonical(code_file, ec);
  if (ec) return false;
  const fs::path build = fs::weakly_canonical(build_dir, ec);
  if (ec) return false;
  // Under the build directory, component by component (a sibling "build-old" is not under "build").
  const auto [b, f] = std::mismatch(build.begin(), build.end(), file.begin(), file.end());
  if (b != build.end() || f == file.end()) return false;
  // And no installation's: one made into a prefix inside the tree (tests/install does) has its own plugin folder.
  const auto own = installPluginDirOf(file, plugin_subdir);
  return !own || identity(*own) == identity(build / plugin_subdir);
}

std::optional<fs::path> PluginLoader::packagePluginDirOf(const fs::path& object_file) {
  std::error_code ec;
  fs::path file = fs::weakly_canonical(object_file, ec);
  if (ec) file = object_file.lexically_normal();
  const fs::path dir = fs::absolute(file, ec).parent_path() / "plugins";
  if (ec || !isDirectory(dir)) return std::nullopt;
  return dir.lexically_normal();
}

PluginLoader::PluginLoader() : PluginLoader(std::vector<fs::path>{}) {}

PluginLoader::PluginLoader(const std::vector<std::string>& plugin_path_args, std::string plugin_path_name)
    : PluginLoader(
          [&] {
            std::vector<fs::path> dirs;
            for (const auto& arg : plugin_path_args) {
              for (auto& d : splitPathList(arg)) dirs.push_back(std::move(d));
            }
            return dirs;
          }(),
          std::move(plugin_path_name)) {}

PluginLoader::PluginLoader(const std::vector<fs::path>& plugin_dirs, std::string plugin_path_name)
    : PluginLoader(DirsTag{}, defaultSearchDirs(plugin_dirs), std::move(plugin_path_name)) {
  for (const auto& d : plugin_dirs) {
    if (isDirectory(d)) continue;
    const std::string relative = d.is_absolute() ? "" : ", looked for as " + fs::absolute(d).string();
    TERSE_THROW(InvalidArgument, "plugin folder " << quotedPath(d) << " (from " << plugin_path_name_ << relative << ") "
                                                  << notAFolder(d));
  }
  for (const auto& d : dirs_) {
    if (d.origin != kOriginEnv || d.exists) continue;
    TERSE_LOG(LogLevel::kWarn, "TERSE_PLUGIN_PATH: " << quotedPath(d.dir) << ' ' << whyNotAFolder(d.dir)
                                                     << ", so no plugin is found there; remove it from "
                                                        "TERSE_PLUGIN_PATH if it is stale");
  }
}

PluginLoader::PluginLoader(DirsTag, std::vector<SearchDir> dirs, std::string plugin_path_name)
    : dirs_(std::move(dirs)),
      registry_(std::make_shared<PluginRegistry>()),
      plugin_path_name_(std::move(plugin_path_name)) {}

PluginLoader PluginLoader::withSearchDirs(std::vector<SearchDir> dirs) {
  return PluginLoader(DirsTag{}, std::move(dirs));
}

std::vector<SearchDir> PluginLoader::searchDirs() const {
  std::vector<SearchDir> out = dirs_;
  for (auto& d : out) d.exists = isDirectory(d.dir);
  return out;
}

bool PluginLoader::isPathArgument(std::string_view arg) noexcept {
  return arg.find('/') != std::string_view::npos || (arg.size() >= 3 && arg.substr(arg.size() - 3) == ".so");
}

std::string PluginLoader::fileNameFor(PluginKind kind, std::string_view name) {
  return kindPrefix(kind) + std::string(name) + ".so";
}

// ---- PluginLoader: loading

PluginLocation PluginLoader::locate(PluginKind kind, std::string_view name) const {
  if (!isValidPluginName(name)) {
    TERSE_THROW(PluginError, pluginKindName(kind) << " name '" << name
                                                  << "' is not valid: plugin names match [a-z0-9_]+ (to load a file "
                                                     "directly, give a path containing '/')");
  }
  const std::string file = fileNameFor(kind, name);
  const std::vector<SearchDir> dirs = searchDirs();
  std::vector<std::pair<fs::path, std::string>> matches;
  for (const auto& d : dirs) {
    if (!d.exists) continue;
    const fs::path candidate = d.dir / file;
    if (isRegularFile(candidate)) matches.emplace_back(candidate, d.origin);
  }
  if (matches.empty()) {
    const std::set<std::string> names = namesIn(dirs, kind);
    std::string available;
    for (const auto& n : names) available += (available.empty() ? "" : ", ") + n;
    TERSE_THROW(
        PluginError, pluginKindName(kind)
                         << " '" << name << "' not found: no " << file
                         << " in any search directory (searched in this order:" << describeDirs(dirs, plugin_path_name_)
                         << "\n); "
                         << (available.empty() ? "none of them holds a " + std::string(pluginKindName(kind))
                                               : "the " + std::string(pluginKindName(kind)) + "s there: " + available)
                         << "; add a directory with " << plugin_path_name_
                         << " or TERSE_PLUGIN_PATH, or give the file's path");
  }
  PluginLocation loc{matches.front().first, matches.front().second, {}};
  loc.shadowed.assign(matches.begin() + 1, matches.end());
  // An installed plugin ahead of its build tree's copy is the order working as meant, not a surprise to warn about
  // (`terse plugins show` still lists the copy it shadows).
  const bool only_the_build_tree =
      loc.origin == kOriginInstall &&
      std::all_of(loc.shadowed.begin(), loc.shadowed.end(), [](const auto& m) { return m.second == kOriginBuildTree; });
  if (!loc.shadowed.empty() && !only_the_build_tree) {
    std::ostringstream o;
    for (const auto& [p, origin] : loc.shadowed)
      o << (o.tellp() > 0 ? ", " : "") << p.string() << " (" << origin << ")";
    TERSE_LOG(LogLevel::kWarn, pluginKindName(kind) << " '" << name << "': using " << loc.path.string() << " ("
                                                    << loc.origin << "); it shadows " << o.str());
  }
  return loc;
}

template <typename PluginT>
std::shared_ptr<const PluginT> PluginLoader::load(PluginKind kind, std::string_view name_or_path) {
  const bool by_path = isPathArgument(name_or_path);
  fs::path path;
  std::string origin;
  std::vector<fs::path> shadowed;
  if (by_path) {
    path = detail::canonicalPluginPath(fs::path(std::string(name_or_path)), kind);
    origin = std::string(kOriginPath);
  } else {
    PluginLocation loc = locate(kind, name_or_path);
    path = detail::canonicalPluginPath(loc.path, kind);
    origin = std::move(loc.origin);
    for (auto& [p, o] : loc.shadowed) shadowed.push_back(std::move(p));
  }

  auto checkName = [&](const PluginInfo& info) {
    if (by_path || info.name == name_or_path) return;
    TERSE_THROW(PluginError, detail::loadErrorPrefix(kind, path)
                                 << "it declares the name '" << info.name << "', but was loaded by the name '"
                                 << name_or_path << "' (the file must be named " << fileNameFor(kind, info.name)
                                 << ")");
  };

  std::shared_ptr<const PluginT> cached;
  if constexpr (std::is_same_v<PluginT, CompressorPlugin>) {
    cached = registry_->findCompressor(path);
  } else {
    cached = registry_->findScheduler(path);
  }
  if (cached) {
    checkName(cached->info());
    return cached;
  }
  auto plugin = PluginT::open(path, std::move(origin), std::move(shadowed));
  checkName(plugin->info());
  if (by_path && path.filename() != fileNameFor(kind, plugin->info().name)) {
    TERSE_LOG(LogLevel::kWarn, detail::pluginLabel(plugin->info())
                                   << ": the file name does not match the declared name, so it cannot be loaded by "
                                      "name (expected "
                                   << fileNameFor(kind, plugin->info().name) << ")");
  }
  return registry_->add(std::move(plugin));
}

std::shared_ptr<const CompressorPlugin> PluginLoader::loadCompressor(std::string_view name_or_path) {
  return load<CompressorPlugin>(PluginKind::kCompressor, name_or_path);
}

std::shared_ptr<const SchedulerPlugin> PluginLoader::loadScheduler(std::string_view name_or_path) {
  return load<SchedulerPlugin>(PluginKind::kScheduler, name_or_path);
}

// ---- Discovery

namespace {

void probeCompressor(DiscoveredPlugin& entry) {
  auto plugin = CompressorPlugin::open(entry.path, entry.origin);
  entry.info = plugin->info();
  std::shared_ptr<Compressor> instance;
  try {
    instance = plugin->instantiate();
  } catch (const std::exception& e) {
    entry.note = std::string("needs parameters: ") + e.what();
    return;
  }
  try {
    entry.compressor_caps = instance->caps(DType::kF32);
  } catch (const Unsupported& e) {
    entry.note = std::string("f32: ") + e.what();
  }
  // A PluginError here (invalid caps) propagates: the plugin is broken, not merely picky.
}

void probeScheduler(DiscoveredPlugin& entry) {
  auto plugin = SchedulerPlugin::open(entry.path, entry.origin);
  entry.info = plugin->info();
  try {
    entry.scheduler_caps = plugin->instantiate()->caps();
  } catch (const PluginError&) {
    throw;  // invalid caps: broken
  } catch (const std::exception& e) {
    entry.note = std::string("needs parameters: ") + e.what();
  }
}

}  // namespace

std::vector<DiscoveredPlugin> PluginLoader::discover() const {
  std::vector<DiscoveredPlugin> out;
  std::map<std::pair<PluginKind, std::string>, fs::path> first;  // the file loading by name would pick
  for (const auto& dir : searchDirs()) {
    if (!dir.exists) continue;
    std::vector<fs::path> files;
    std::error_code ec;
    for (fs::directory_iterator it(dir.dir, ec), end; !ec && it != end; it.increment(ec)) {
      if (isRegularFile(it->path())) files.push_back(it->path());
    }
    if (ec)
      TERSE_LOG(LogLevel::kWarn, "cannot list " << dir.dir.string() << " (" << dir.origin << "): " << ec.message());
    std::sort(files.begin(), files.end());
    for (const auto& file : files) {
      const std::string fname = file.filename().string();
      for (PluginKind kind : {PluginKind::kCompressor, PluginKind::kScheduler}) {
        const std::string prefix = kindPrefix(kind);
        if (fname.size() <= prefix.size() + 3 || fname.compare(0, prefix.size(), prefix) != 0 ||
            fname.compare(fname.size() - 3, 3, ".so") != 0) {
          continue;
        }
        DiscoveredPlugin entry;
        entry.kind = kind;
        entry.name = fname.substr(prefix.size(), fname.size() - prefix.size() - 3);
        entry.path = file;
        entry.origin = dir.origin;
        auto [it, inserted] = first.emplace(std::pair{kind, entry.name}, file);
        if (!inserted) entry.shadowed_by = it->second;
        try {
          if (!isValidPluginName(entry.name)) {
            TERSE_THROW(PluginError, detail::loadErrorPrefix(kind, file)
                                         << "'" << entry.name << "' in the file name is not a valid plugin name "
                                         << "([a-z0-9_]+)");
          }
          if (kind == PluginKind::kCompressor) {
            probeCompressor(entry);
          } else {
            probeScheduler(entry);
          }
          if (entry.info && entry.info->name != entry.name) {
            TERSE_THROW(PluginError, detail::loadErrorPrefix(kind, file) << "it declares the name '" << entry.info->name
                                                                         << "', which does not match its file name");
          }
        } catch (const std::exception& e) {
          entry.error = e.what();
        } catch (...) {
          entry.error = "unknown exception while loading " + file.string();
        }
        out.push_back(std::move(entry));
      }
    }
  }
  return out;
}

}  // namespace terse
