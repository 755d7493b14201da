// What the loader knows about a loaded plugin file; written into results as provenance.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace terse {

enum class PluginKind { kCompressor, kScheduler };

constexpr std::string_view pluginKindName(PluginKind k) noexcept {
  return k == PluginKind::kCompressor ? "compressor" : "scheduler";
}

struct PluginInfo {
  PluginKind kind = PluginKind::kCompressor;
  std::string name;  // as the plugin declares it
  std::string description;
  std::string version;         // the plugin's own version string
  uint32_t abi_version = 0;    // the ABI the plugin was built against (after adaptation the core drives the newest)
  std::filesystem::path path;  // canonical path of the file that was loaded
  // How the loader found the file: a search-dir origin ("--plugin-path", "TERSE_PLUGIN_PATH", "build tree",
  // "install") or "path" when it was named by path. Provenance: two runs that loaded different files say so.
  std::string origin;
  // Files with the same name later in the search order that were NOT loaded (first match wins).
  std::vector<std::filesystem::path> shadowed;
  // Whether the plugin was compiled with optimisation, as its optional terse_<kind>_build_info_v1 says
  // (terse/build_info_v1.h); nullopt when the file does not export it (C plugins, plugins built before it existed).
  // A plugin at -O0 runs several times slower, which would pass for a property of its method in a benchmark.
  std::optional<bool> optimized;
};

// Plugin names are [a-z0-9_]+: they become file names (terse_compressor_<name>.so), so anything else (a '/', "..")
// could reach outside the search directories.
constexpr bool isValidPluginName(std::string_view name) noexcept {
  if (name.empty()) return false;
  for (char c : name) {
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

}  // namespace terse
