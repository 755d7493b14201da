// What the loader knows about a loaded plugin file; written into results as provenance.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace terse {

enum class PluginKind { kCompressor, kScheduler };

constexpr std::string_view pluginKindName(PluginKind k) noexcept {
  return k == PluginKind::kCompressor ? "compressor" : "scheduler";
}

struct PluginInfo {
  PluginKind kind = PluginKind::kCompressor;
  std::string name;         // as the plugin declares it
  std::string description;
  std::string version;      // the plugin's own version string
  uint32_t abi_version = 0; // the ABI the plugin was built against (after adaptation the core drives the newest)
  std::filesystem::path path;  // canonical path of the file that was loaded
};

}  // namespace terse
