// A loaded compressor plugin file: what it declares (PluginInfo) and a factory for checked instances. The file stays
// mapped while this object or any instance made from it lives.
//
// The loader tries the ABI versions this build knows newest first (NCCL's habit); each has an adapter that validates
// the exported struct and lifts it to the newest layout, so the instance code drives one struct only. A v2 is one more
// row in the table in compressor_plugin.cc plus an adapter that fills v2's new fields for v1 plugins.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "core/plugin/compressor.h"
#include "core/plugin/plugin_info.h"

namespace terse {

class CompressorPlugin : public std::enable_shared_from_this<CompressorPlugin> {
 public:
  // dlopens `path` and validates what it exports (ABI version, struct size, required fields, name). Throws
  // PluginError naming the file and the reason. `origin` and `shadowed` are recorded in info() for provenance.
  // This does not check the file name or uniqueness of the name; PluginLoader does.
  static std::shared_ptr<const CompressorPlugin> open(const std::filesystem::path& path, std::string origin = "path",
                                                      std::vector<std::filesystem::path> shadowed = {});

  // The compressor ABI versions this build loads, newest first.
  static std::vector<uint32_t> supportedAbiVersions();

  const PluginInfo& info() const noexcept;

  // Calls the plugin's init with `params` (keys must be unique). Throws the terse::Error matching init's status with
  // the plugin's message, e.g. InvalidArgument "... init failed [invalid argument]: topk: 'ratio' must be in (0, 1],
  // got 2". The instance keeps this plugin (and its file) alive.
  std::shared_ptr<Compressor> instantiate(const Params& params = {}) const;

  struct Impl;
  explicit CompressorPlugin(std::unique_ptr<Impl> impl);
  ~CompressorPlugin();

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace terse
