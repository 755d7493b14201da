// terse plugin SDK: the host (the core's logger) as a plugin sees it, and the one place where C++ exceptions turn into
// status codes at the C boundary.
#pragma once

#include <exception>
#include <new>
#include <string>
#include <string_view>
#include <utility>

#include "terse/sdk/error.hpp"
#include "terse/types_v1.h"

namespace terse::sdk {

// The core's services for one plugin instance. Cheap to copy; the terse_host_v1 it wraps stays valid until finalize,
// so an instance may keep a copy for its whole life. Thread-safe, like the callback it wraps.
class Host {
 public:
  explicit Host(const terse_host_v1* host) noexcept : host_(host) {}

  // Sends `message` as is. Never throws: a message that cannot be delivered (no memory to copy it) is dropped, because
  // logging must not turn a working call into a failing one.
  void log(terse_log_level_v1 level, std::string_view message) const noexcept {
    if (host_ == nullptr || host_->log == nullptr) return;
    try {
      std::string copy(message);  // the callback wants a NUL-terminated string
      host_->log(host_->user, level, copy.c_str());
    } catch (...) {
    }
  }
  void debug(std::string_view message) const noexcept { log(TERSE_LOG_DEBUG, message); }
  void info(std::string_view message) const noexcept { log(TERSE_LOG_INFO, message); }
  void warn(std::string_view message) const noexcept { log(TERSE_LOG_WARN, message); }
  void error(std::string_view message) const noexcept { log(TERSE_LOG_ERROR, message); }

  const terse_host_v1* raw() const noexcept { return host_; }

 private:
  const terse_host_v1* host_;
};

namespace detail {

// "name: message", unless the message already starts with that prefix (Params and PayloadFormat messages name the
// plugin themselves, and "topk: topk: ..." helps nobody).
inline void logError(const terse_host_v1* host, const char* plugin, const char* message) noexcept {
  if (host == nullptr || host->log == nullptr) return;
  try {
    std::string prefix = std::string(plugin) + ": ";
    std::string text = std::string_view(message).starts_with(prefix) ? std::string(message) : prefix + message;
    host->log(host->user, TERSE_LOG_ERROR, text.c_str());
  } catch (...) {
    // No memory for the prefix: the bare message still says what went wrong.
    host->log(host->user, TERSE_LOG_ERROR, message);
  }
}

// Runs `body` and maps whatever it throws to a status, logging the reason first (the core attaches the last ERROR
// message of the thread to the error it raises). Every generated C entry point goes through here, so no exception
// crosses the ABI.
template <class Body>
terse_status_v1 guard(const terse_host_v1* host, const char* plugin, Body&& body) noexcept {
  try {
    std::forward<Body>(body)();
    return TERSE_OK;
  } catch (const Error& e) {
    logError(host, plugin, e.what());
    // An Error built with TERSE_OK or an unknown code must still fail the call.
    const terse_status_v1 s = e.status();
    return s >= TERSE_ERR_INVALID_ARGUMENT && s <= TERSE_ERR_INTERNAL ? s : TERSE_ERR_INTERNAL;
  } catch (const std::bad_alloc&) {
    logError(host, plugin, "out of memory (std::bad_alloc)");
    return TERSE_ERR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    logError(host, plugin, e.what());
    return TERSE_ERR_INTERNAL;
  } catch (...) {
    logError(host, plugin, "unknown exception (not derived from std::exception)");
    return TERSE_ERR_INTERNAL;
  }
}

// The ABI's rule for plugin names, checked at compile time by the export macros.
constexpr bool isValidPluginName(const char* name) {
  if (name == nullptr || *name == '\0') return false;
  for (const char* p = name; *p != '\0'; ++p) {
    const char c = *p;
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
  }
  return true;
}

}  // namespace detail
}  // namespace terse::sdk
