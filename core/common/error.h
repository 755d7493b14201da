// Errors inside terse: a small exception hierarchy whose messages carry [file:line] and the values involved (Gloo's
// habit). Exceptions never cross the plugin ABI: there they become terse_status_v1 codes plus a logged message, and the
// core turns a plugin's status back into one of these.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "terse/types_v1.h"

namespace terse {

class Error : public std::runtime_error {
 public:
  Error(terse_status_v1 status, const std::string& message) : std::runtime_error(message), status_(status) {}
  terse_status_v1 status() const noexcept { return status_; }

 private:
  terse_status_v1 status_;
};

// Bad configuration, parameters or API use: the caller can fix it.
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& m) : Error(TERSE_ERR_INVALID_ARGUMENT, m) {}
};

// Malformed data that came from outside (a payload, a network frame, a file): never trusted.
class InvalidPayload : public Error {
 public:
  explicit InvalidPayload(const std::string& m) : Error(TERSE_ERR_INVALID_PAYLOAD, m) {}
};

// A valid request this build or plugin cannot serve (dtype, device, shape).
class Unsupported : public Error {
 public:
  explicit Unsupported(const std::string& m) : Error(TERSE_ERR_UNSUPPORTED, m) {}
};

// A plugin that could not be loaded or broke its contract; the message names the file and the reason.
class PluginError : public Error {
 public:
  explicit PluginError(const std::string& m, terse_status_v1 s = TERSE_ERR_INVALID_ARGUMENT) : Error(s, m) {}
};

// A CUDA or NCCL call failed.
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& m) : Error(TERSE_ERR_DEVICE, m) {}
};

// A broken invariant inside terse itself.
class InternalError : public Error {
 public:
  explicit InternalError(const std::string& m) : Error(TERSE_ERR_INTERNAL, m) {}
};

namespace detail {
inline std::string where(const char* file, int line) {
  std::string f(file);
  // Keep the path from the project's top folders on, so messages do not carry the build machine's paths.
  for (const char* top : {"core/", "plugins/", "compressors/", "schedulers/", "experiments/", "results/", "tests/"}) {
    if (auto pos = f.rfind(top); pos != std::string::npos)
      return "[" + f.substr(pos) + ":" + std::to_string(line) + "] ";
  }
  return "[" + f + ":" + std::to_string(line) + "] ";
}
}  // namespace detail

}  // namespace terse

// TERSE_THROW(terse::InvalidArgument, "ratio must be in (0, 1], got " << r): throws with [file:line] in front.
#define TERSE_THROW(Type, stream_expr)                                       \
  do {                                                                       \
    std::ostringstream terse_oss_;                                           \
    terse_oss_ << ::terse::detail::where(__FILE__, __LINE__) << stream_expr; \
    throw Type(terse_oss_.str());                                            \
  } while (0)

// TERSE_CHECK(cond, Type, stream_expr): throws Type when cond is false.
#define TERSE_CHECK(cond, Type, stream_expr)     \
  do {                                           \
    if (!(cond)) TERSE_THROW(Type, stream_expr); \
  } while (0)
