// terse plugin SDK, internal: the argument checks every generated entry point makes before the plugin's code runs, so
// a plugin sees spans that are never NULL-with-a-length and tensor info it can index with. A failed check is the
// core's bug, reported as TERSE_ERR_INVALID_ARGUMENT with the call and the argument named.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <string>
#include <type_traits>

#include "terse/compressor_v1.h"
#include "terse/sdk/dtype.hpp"
#include "terse/sdk/error.hpp"

namespace terse::sdk::detail {

// The core fills struct_size with sizeof as it was built; writing a v1 struct into less would overrun its memory.
inline void checkStructSize(uint32_t given, size_t expected, const char* what) {
  if (given < expected) {
    throw InvalidArgument(std::string(what) + ": struct_size is " + std::to_string(given) + ", expected at least " +
                          std::to_string(expected));
  }
}

template <class T>
T* checkedPointer(T* p, const char* what) {
  if (p == nullptr) throw InvalidArgument(std::string(what) + " is NULL");
  return p;
}

template <class Byte, class Void>
std::span<Byte> bytesOf(Void* p, uint64_t n, const char* what) {
  if (n == 0) return {};
  if (p == nullptr) throw InvalidArgument(std::string(what) + " is NULL but " + std::to_string(n) + " bytes long");
  if (n > std::numeric_limits<size_t>::max()) throw InvalidArgument(std::string(what) + " is larger than memory");
  return {static_cast<Byte*>(p), static_cast<size_t>(n)};
}

inline void checkInfo(const terse_tensor_info_v1* info, const char* call) {
  if (info == nullptr) throw InvalidArgument(std::string(call) + ": tensor info is NULL");
  checkStructSize(info->struct_size, sizeof(terse_tensor_info_v1), (std::string(call) + ": tensor info").c_str());
  if (!isValidDtype(info->dtype)) {
    throw InvalidArgument(std::string(call) + ": tensor info has unknown dtype " + std::to_string(info->dtype));
  }
  if (info->numel > std::numeric_limits<size_t>::max() / dtypeSize(info->dtype)) {
    throw InvalidArgument(std::string(call) + ": a tensor of " + std::to_string(info->numel) +
                          " elements does not fit in memory");
  }
}

// A typed view of a tensor buffer of info.numel elements (the pointer may be device memory: the view is not read here).
template <class T, class Void>
std::span<T> tensorView(const terse_tensor_info_v1& info, Void* p, const char* what) {
  using Elem = std::remove_const_t<T>;
  if (!dtypeMatches<Elem>(info.dtype)) {
    const std::string as =
        kDtypeOf<Elem> >= 0 ? dtypeName(kDtypeOf<Elem>) : std::to_string(sizeof(Elem)) + "-byte elements";
    throw Unsupported("cannot view the " + dtypeName(info.dtype) + " " + what + " as " + as);
  }
  if (info.numel == 0) return {};
  return {static_cast<T*>(p), static_cast<size_t>(info.numel)};
}

}  // namespace terse::sdk::detail
