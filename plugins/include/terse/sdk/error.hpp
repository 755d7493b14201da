// terse plugin SDK: the exceptions a plugin throws. The export macros turn each into its status code at the C boundary
// and log its message through the host (prefixed with the plugin's name), so plugin code reports a problem by
// throwing with the values involved and never handles a terse_status_v1 itself.
#pragma once

#include <stdexcept>
#include <string>

#include "terse/types_v1.h"

namespace terse::sdk {

// Base of every SDK exception: carries the status the C boundary returns.
class Error : public std::runtime_error {
 public:
  Error(terse_status_v1 status, const std::string& message) : std::runtime_error(message), status_(status) {}
  terse_status_v1 status() const noexcept { return status_; }

 private:
  terse_status_v1 status_;
};

// A parameter, tensor info or buffer size the plugin cannot accept (TERSE_ERR_INVALID_ARGUMENT).
class InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& message) : Error(TERSE_ERR_INVALID_ARGUMENT, message) {}
};

// A payload that failed validation (TERSE_ERR_INVALID_PAYLOAD). Payloads come from the network: untrusted input.
class InvalidPayload : public Error {
 public:
  explicit InvalidPayload(const std::string& message) : Error(TERSE_ERR_INVALID_PAYLOAD, message) {}
};

// A dtype, device or shape the plugin does not handle (TERSE_ERR_UNSUPPORTED).
class Unsupported : public Error {
 public:
  explicit Unsupported(const std::string& message) : Error(TERSE_ERR_UNSUPPORTED, message) {}
};

// A CUDA call failed (TERSE_ERR_DEVICE); CUDA plugins throw it with cudaGetErrorString and the call.
class DeviceError : public Error {
 public:
  explicit DeviceError(const std::string& message) : Error(TERSE_ERR_DEVICE, message) {}
};

}  // namespace terse::sdk
