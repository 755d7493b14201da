#include "core/plugin/plugin_support.h"

#include <dlfcn.h>

#include <set>
#include <sstream>
#include <utility>

#include "core/common/error.h"
#include "core/common/log.h"

namespace terse::detail {

std::string loadErrorPrefix(PluginKind kind, const std::filesystem::path& path) {
  return "cannot load " + std::string(pluginKindName(kind)) + " plugin " + path.string() + ": ";
}

std::filesystem::path canonicalPluginPath(const std::filesystem::path& path, PluginKind kind) {
  std::error_code ec;
  auto canonical = std::filesystem::canonical(path, ec);
  if (ec) TERSE_THROW(PluginError, loadErrorPrefix(kind, path) << "no such file (" << ec.message() << ")");
  if (!std::filesystem::is_regular_file(canonical, ec))
    TERSE_THROW(PluginError, loadErrorPrefix(kind, path) << "not a regular file");
  return canonical;
}

std::shared_ptr<SharedLibrary> SharedLibrary::open(const std::filesystem::path& path, PluginKind kind) {
  // Clear any stale error so the text we report belongs to this dlopen.
  dlerror();
  // NODELETE: a plugin stays mapped once loaded. CUDA's runtime keeps what a plugin's kernels registered after the
  // plugin is closed: on an H200 (CUDA 13), a plugin closed and opened again in one process launched stale kernels
  // (cudaErrorInvalidKernelImage, hangs in the launch, heap corruption). Reopening now returns the mapped file, whose
  // kernels are still registered; the cost is that a plugin's memory is given back only at exit.
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (handle == nullptr) {
    const char* why = dlerror();
    TERSE_THROW(PluginError, loadErrorPrefix(kind, path) << "dlopen failed: " << (why ? why : "unknown error"));
  }
  return std::shared_ptr<SharedLibrary>(new SharedLibrary(handle, path));
}

SharedLibrary::~SharedLibrary() {
  if (handle_ != nullptr) dlclose(handle_);
}

const void* SharedLibrary::symbol(const char* name) const noexcept {
  return dlsym(handle_, name);
}

std::string pluginSymbol(PluginKind kind, uint32_t version) {
  return "terse_" + std::string(pluginKindName(kind)) + "_plugin_v" + std::to_string(version);
}

namespace {

std::string versionList(std::span<const uint32_t> versions) {
  std::string out;
  for (uint32_t v : versions) out += (out.empty() ? "v" : ", v") + std::to_string(v);
  return out;
}

}  // namespace

void throwNoPluginSymbol(const SharedLibrary& lib, PluginKind kind, std::span<const uint32_t> supported) {
  const std::string prefix = loadErrorPrefix(kind, lib.path());
  const std::set<uint32_t> known(supported.begin(), supported.end());
  // Newest first: a file exporting v2 and v3 was built for v3.
  for (uint32_t v = kMaxProbedAbiVersion; v >= 1; --v) {
    if (known.count(v) == 0 && lib.symbol(pluginSymbol(kind, v).c_str()) != nullptr) {
      TERSE_THROW(PluginError, prefix << "built for " << pluginKindName(kind) << " ABI v" << v << " (exports "
                                      << pluginSymbol(kind, v) << "); this terse supports " << versionList(supported));
    }
  }
  const PluginKind other = kind == PluginKind::kCompressor ? PluginKind::kScheduler : PluginKind::kCompressor;
  for (uint32_t v = 1; v <= kMaxProbedAbiVersion; ++v) {
    if (lib.symbol(pluginSymbol(other, v).c_str()) != nullptr) {
      TERSE_THROW(PluginError, prefix << "not a " << pluginKindName(kind) << " plugin: it exports "
                                      << pluginSymbol(other, v) << ", so it is a " << pluginKindName(other)
                                      << " plugin");
    }
  }
  TERSE_THROW(PluginError, prefix << "not a terse " << pluginKindName(kind) << " plugin: it exports no "
                                  << pluginSymbol(kind, supported.empty() ? 1 : supported.front()) << " symbol");
}

std::string pluginLabel(const PluginInfo& info) {
  return std::string(pluginKindName(info.kind)) + " '" + info.name + "' (" + info.path.string() + ")";
}

std::string statusName(terse_status_v1 status) {
  switch (status) {
    case TERSE_OK:
      return "ok";
    case TERSE_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case TERSE_ERR_INVALID_PAYLOAD:
      return "invalid payload";
    case TERSE_ERR_UNSUPPORTED:
      return "unsupported";
    case TERSE_ERR_OUT_OF_MEMORY:
      return "out of memory";
    case TERSE_ERR_DEVICE:
      return "device error";
    case TERSE_ERR_INTERNAL:
      return "plugin error";
    default:
      return "unknown status " + std::to_string(status);
  }
}

namespace {

// The reason for the current plugin call's failure. Per thread because the ABI lets calls for different tensors of
// one instance run concurrently; a plugin reports the error on the thread whose call fails.
thread_local std::string t_last_error;
thread_local bool t_has_error = false;

LogLevel toLogLevel(terse_log_level_v1 level) {
  switch (level) {
    case TERSE_LOG_DEBUG:
      return LogLevel::kDebug;
    case TERSE_LOG_INFO:
      return LogLevel::kInfo;
    case TERSE_LOG_WARN:
      return LogLevel::kWarn;
    default:
      return LogLevel::kError;
  }
}

}  // namespace

HostBinding::HostBinding(std::string label) : label_(std::move(label)) {
  host_.struct_size = sizeof(terse_host_v1);
  host_.reserved0 = 0;
  host_.user = this;
  host_.log = &HostBinding::log;
}

void HostBinding::log(void* user, terse_log_level_v1 level, const char* message) noexcept {
  // Called from C: nothing may escape. A failure to log is not worth failing the plugin's call over.
  try {
    const auto* self = static_cast<const HostBinding*>(user);
    const char* text = message != nullptr ? message : "(null message)";
    if (level == TERSE_LOG_ERROR) {
      t_last_error = text;
      t_has_error = true;
      // The text reaches the user as the message of the error the core raises; printing it here too would show every
      // failure twice (and print errors that the caller handles, e.g. `terse plugins list` probing parameters).
      TERSE_LOG(LogLevel::kDebug, (self ? self->label_ : std::string("plugin")) << ": " << text);
      return;
    }
    TERSE_LOG(toLogLevel(level), (self ? self->label_ : std::string("plugin")) << ": " << text);
  } catch (...) {
  }
}

void clearPluginError() noexcept {
  t_last_error.clear();
  t_has_error = false;
}

std::string takePluginError() {
  std::string out = t_has_error ? std::move(t_last_error) : std::string("(the plugin logged no message)");
  clearPluginError();
  return out;
}

void throwPluginStatus(const std::string& label, std::string_view call, terse_status_v1 status,
                       std::string_view context) {
  std::ostringstream msg;
  msg << where(__FILE__, __LINE__) << label << ": " << call << " failed [" << statusName(status)
      << "]: " << takePluginError() << context;
  switch (status) {
    case TERSE_ERR_INVALID_ARGUMENT:
      throw InvalidArgument(msg.str());
    case TERSE_ERR_INVALID_PAYLOAD:
      throw InvalidPayload(msg.str());
    case TERSE_ERR_UNSUPPORTED:
      throw Unsupported(msg.str());
    case TERSE_ERR_OUT_OF_MEMORY:
      throw Error(TERSE_ERR_OUT_OF_MEMORY, msg.str());
    case TERSE_ERR_DEVICE:
      throw DeviceError(msg.str());
    default:
      throw PluginError(msg.str(), TERSE_ERR_INTERNAL);
  }
}

void throwPluginBrokeContract(const std::string& label, std::string_view call, const std::string& what) {
  std::ostringstream msg;
  msg << where(__FILE__, __LINE__) << label << ": " << call << " failed [" << statusName(TERSE_ERR_INTERNAL)
      << "]: " << what;
  throw PluginError(msg.str(), TERSE_ERR_INTERNAL);
}

std::vector<terse_param_v1> toAbiParams(const Params& params, const std::string& label) {
  std::vector<terse_param_v1> out;
  out.reserve(params.size());
  std::set<std::string_view> seen;
  for (const auto& [key, value] : params) {
    if (!seen.insert(key).second) TERSE_THROW(InvalidArgument, label << ": parameter '" << key << "' given twice");
    out.push_back(terse_param_v1{key.c_str(), value.c_str()});
  }
  return out;
}

terse_resolved_params_fn_v1 resolvedParamsEntry(const SharedLibrary& lib, PluginKind kind) {
  const void* symbol = lib.symbol(kind == PluginKind::kCompressor ? TERSE_COMPRESSOR_RESOLVED_PARAMS_V1_SYMBOL
                                                                  : TERSE_SCHEDULER_RESOLVED_PARAMS_V1_SYMBOL);
  // dlsym hands functions back as object pointers; POSIX guarantees the round trip.
  return reinterpret_cast<terse_resolved_params_fn_v1>(const_cast<void*>(symbol));
}

std::optional<bool> builtOptimized(const SharedLibrary& lib, PluginKind kind) {
  const char* name =
      kind == PluginKind::kCompressor ? TERSE_COMPRESSOR_BUILD_INFO_V1_SYMBOL : TERSE_SCHEDULER_BUILD_INFO_V1_SYMBOL;
  const void* symbol = lib.symbol(name);
  if (symbol == nullptr) return std::nullopt;
  // struct_size first: the flags may only be read once it says they are there.
  uint32_t struct_size = 0;
  std::memcpy(&struct_size, symbol, sizeof struct_size);
  if (struct_size < sizeof(terse_build_info_v1)) {
    TERSE_LOG(LogLevel::kWarn, pluginKindName(kind) << " plugin " << lib.path().string() << ": " << name
                                                    << " has struct_size " << struct_size << ", v1 needs "
                                                    << sizeof(terse_build_info_v1) << "; how it was built is unknown");
    return std::nullopt;
  }
  terse_build_info_v1 info;
  std::memcpy(&info, symbol, sizeof info);
  return (info.flags & TERSE_BUILD_OPTIMIZED) != 0;
}

std::optional<Params> queryResolvedParams(terse_resolved_params_fn_v1 entry, void* ctx, const std::string& label) {
  if (entry == nullptr) return std::nullopt;
  const terse_param_v1* table = nullptr;
  size_t count = 0;
  clearPluginError();
  const terse_status_v1 status = entry(ctx, &table, &count);
  std::string bad;
  if (status != TERSE_OK) {
    bad = std::string("failed [") + statusName(status) + "]: " + takePluginError();
  } else if (table == nullptr && count > 0) {
    bad = "returned a NULL table of " + std::to_string(count) + " entries";
  }
  Params out;
  std::set<std::string_view> seen;
  for (size_t i = 0; bad.empty() && i < count; ++i) {
    if (table[i].key == nullptr || table[i].value == nullptr) {
      bad = "entry " + std::to_string(i) + " has a NULL key or value";
    } else if (!seen.insert(table[i].key).second) {
      bad = "reports '" + std::string(table[i].key) + "' twice";
    } else {
      out.emplace_back(table[i].key, table[i].value);
    }
  }
  if (bad.empty()) return out;
  TERSE_LOG(LogLevel::kWarn, label << ": resolved_params " << bad << "; its defaults are not recorded");
  return std::nullopt;
}

}  // namespace terse::detail
