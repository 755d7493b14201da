// Internals shared by the compressor and scheduler adapters and the loader: the dlopen handle, the host callback that
// routes plugin messages to the core log, and the mapping of a plugin's status code to a terse::Error. Not part of the
// core's public surface (nothing outside core/plugin includes it).
#pragma once

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/error.h"
#include "core/plugin/compressor.h"
#include "core/plugin/plugin_info.h"
#include "terse/build_info_v1.h"
#include "terse/resolved_params_v1.h"
#include "terse/types_v1.h"

namespace terse::detail {

// A dlopen-ed file. Shared ownership: the plugin object and every instance made from it hold a reference, so the
// code behind their function pointers stays mapped until the last one is gone.
class SharedLibrary {
 public:
  // dlopen(RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE): NOW so a missing dependency fails here, with dlerror's text, and
  // not in the middle of a run; LOCAL so two plugins' internal symbols never bind to each other; NODELETE so a file
  // once loaded stays mapped (CUDA plugins cannot be unloaded and loaded again: plugin_support.cc). Throws
  // PluginError naming the file.
  static std::shared_ptr<SharedLibrary> open(const std::filesystem::path& path, PluginKind kind);
  ~SharedLibrary();
  SharedLibrary(const SharedLibrary&) = delete;
  SharedLibrary& operator=(const SharedLibrary&) = delete;

  const void* symbol(const char* name) const noexcept;  // nullptr when the file does not export it
  const std::filesystem::path& path() const noexcept { return path_; }

 private:
  SharedLibrary(void* handle, std::filesystem::path path) : handle_(handle), path_(std::move(path)) {}
  void* handle_;
  std::filesystem::path path_;
};

// The absolute, symlink-free path of an existing plugin file (the identity the registry keys on, and what provenance
// records). Throws PluginError "cannot load ... plugin <path>: no such file" otherwise.
std::filesystem::path canonicalPluginPath(const std::filesystem::path& path, PluginKind kind);

// "terse_compressor_plugin_v3"
std::string pluginSymbol(PluginKind kind, uint32_t version);

// Reads the exported struct of a v1 plugin of either kind (Api = terse_compressor_v1 or terse_scheduler_v1) and checks
// what every kind's struct starts with: abi_version against the symbol's version, struct_size, the three strings and
// the name's spelling. `required` lists the function pointers that must not be NULL. Every error starts with `prefix`
// ("cannot load compressor plugin <path>: ").
template <class Api>
Api readPluginStruct(const void* symbol, uint32_t abi_version, const char* symbol_name, const std::string& prefix,
                     std::initializer_list<std::pair<const char*, bool (*)(const Api&)>> required) {
  // abi_version and struct_size are the only fields every version shares; read them before trusting anything else.
  uint32_t head[2];
  std::memcpy(head, symbol, sizeof head);
  if (head[0] != abi_version) {
    TERSE_THROW(PluginError, prefix << "abi_version field is " << head[0] << ", but the exported symbol " << symbol_name
                                    << " is ABI v" << abi_version);
  }
  if (head[1] < sizeof(Api))
    TERSE_THROW(PluginError,
                prefix << "struct too small: " << head[1] << " bytes, v" << abi_version << " needs " << sizeof(Api));
  // A larger struct_size is accepted and only the known part is read: it cannot describe a different layout, since a
  // changed layout is a new symbol version.
  Api api;
  std::memcpy(&api, symbol, sizeof api);
  const std::pair<const char*, const char*> strings[] = {
      {"name", api.name}, {"description", api.description}, {"version", api.version}};
  for (auto [field, value] : strings)
    if (value == nullptr) TERSE_THROW(PluginError, prefix << "field '" << field << "' is NULL");
  if (!isValidPluginName(api.name))
    TERSE_THROW(PluginError, prefix << "declared name '" << api.name << "' does not match [a-z0-9_]+");
  for (const auto& [field, present] : required)
    if (!present(api)) TERSE_THROW(PluginError, prefix << "required function pointer '" << field << "' is NULL");
  return api;
}

// The highest ABI version whose symbol name the loader probes when no supported symbol is found, so a plugin built
// for a newer terse gets "built for compressor ABI v2" instead of "not a terse plugin".
inline constexpr uint32_t kMaxProbedAbiVersion = 9;

// Throws the PluginError for a file that exports no supported symbol of `kind`: built for a newer ABI, a plugin of
// the other kind, or not a terse plugin at all.
[[noreturn]] void throwNoPluginSymbol(const SharedLibrary& lib, PluginKind kind, std::span<const uint32_t> supported);

// "cannot load compressor plugin /abs/path.so: " — the start of every load error.
std::string loadErrorPrefix(PluginKind kind, const std::filesystem::path& path);

// "compressor 'topk' (/abs/path/terse_compressor_topk.so)" — the start of every error about a loaded plugin.
std::string pluginLabel(const PluginInfo& info);

// "invalid argument", "invalid payload", ...; "unknown status N" for a code outside the v1 set. Names a plugin's status
// only: TERSE_ERR_INTERNAL is "plugin error", since the ABI gives it to a bug inside the plugin (types_v1.h), and
// "internal error" read as a fault of terse's own.
std::string statusName(terse_status_v1 status);

// The host callback bound to one plugin instance: messages go to the core log prefixed with the instance's label, and
// an ERROR message is remembered (per thread) as the reason for the call's failure. Lives as long as the instance:
// the plugin keeps the terse_host_v1 pointer until finalize returns.
class HostBinding {
 public:
  explicit HostBinding(std::string label);
  HostBinding(const HostBinding&) = delete;
  HostBinding& operator=(const HostBinding&) = delete;
  const terse_host_v1* host() const noexcept { return &host_; }

 private:
  static void log(void* user, terse_log_level_v1 level, const char* message) noexcept;
  std::string label_;
  terse_host_v1 host_{};
};

// Forgets the calling thread's last plugin ERROR message; call before each plugin call.
void clearPluginError() noexcept;
// The calling thread's last plugin ERROR message since clearPluginError, or "(the plugin logged no message)".
std::string takePluginError();

// Throws the terse::Error subclass matching a plugin's non-OK status: InvalidArgument, InvalidPayload, Unsupported,
// DeviceError, Error(OUT_OF_MEMORY), or PluginError(INTERNAL) for INTERNAL and unknown codes. The message is
// "<label>: <call> failed [<status name>]: <the plugin's last ERROR message><context>", where `context` says which
// call of a run it was (" (tensor 3, step 57)": callContext in compressor_plugin.cc), since the plugin's own message
// cannot.
[[noreturn]] void throwPluginStatus(const std::string& label, std::string_view call, terse_status_v1 status,
                                    std::string_view context = {});

// Throws the PluginError for a call that returned TERSE_OK but broke its contract (a size it reported), classified as
// throwPluginStatus classifies TERSE_ERR_INTERNAL, which the SDK returns when it catches the same breach first: one
// error whichever side sees it. The message is "<label>: <call> failed [plugin error]: <what>".
[[noreturn]] void throwPluginBrokeContract(const std::string& label, std::string_view call, const std::string& what);

// Parameters as the ABI wants them: pointers into `params`, which must outlive the result. Throws InvalidArgument for
// a repeated key (the ABI promises plugins unique keys).
std::vector<terse_param_v1> toAbiParams(const Params& params, const std::string& label);

// The optional entry point terse_<kind>_resolved_params_v1 of `lib` (terse/resolved_params_v1.h); nullptr when the
// file does not export it (every plugin built before it existed, and C plugins that leave it out).
terse_resolved_params_fn_v1 resolvedParamsEntry(const SharedLibrary& lib, PluginKind kind);

// What the optional terse_<kind>_build_info_v1 of `lib` (terse/build_info_v1.h) says of optimisation; nullopt when
// the file does not export it, or exports one too small to hold the flags (logged as a warning: the plugin still
// loads, since the symbol only informs).
std::optional<bool> builtOptimized(const SharedLibrary& lib, PluginKind kind);

// The parameters the instance `ctx` resolved, defaults included, through `entry`; nullopt when `entry` is nullptr.
// A failed call or a malformed answer (a NULL table or string, a repeated key) is logged as a warning and also gives
// nullopt: provenance then says the defaults were not reported, and the run goes on.
std::optional<Params> queryResolvedParams(terse_resolved_params_fn_v1 entry, void* ctx, const std::string& label);

}  // namespace terse::detail
