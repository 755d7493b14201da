// terse plugin SDK: element types. The core has its own DType; the SDK cannot depend on core/, so plugins get these
// small helpers over the ABI's terse_dtype_v1 values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "terse/types_v1.h"

namespace terse::sdk {

constexpr bool isValidDtype(terse_dtype_v1 t) noexcept {
  return t >= 0 && t < TERSE_DTYPE_COUNT_V1;
}

// Bytes per element; 0 outside the enumeration (a value from the core is checked by the export wrappers first).
constexpr std::size_t dtypeSize(terse_dtype_v1 t) noexcept {
  switch (t) {
    case TERSE_DTYPE_F32:
      return 4;
    case TERSE_DTYPE_F16:
      return 2;
    case TERSE_DTYPE_BF16:
      return 2;
    case TERSE_DTYPE_F64:
      return 8;
    case TERSE_DTYPE_I32:
      return 4;
    case TERSE_DTYPE_I64:
      return 8;
    case TERSE_DTYPE_U8:
      return 1;
    case TERSE_DTYPE_I8:
      return 1;
    default:
      return 0;
  }
}

// "f32", "bf16", ...; "dtype(N)" for a value outside the enumeration, so messages about bad input stay readable.
inline std::string dtypeName(terse_dtype_v1 t) {
  switch (t) {
    case TERSE_DTYPE_F32:
      return "f32";
    case TERSE_DTYPE_F16:
      return "f16";
    case TERSE_DTYPE_BF16:
      return "bf16";
    case TERSE_DTYPE_F64:
      return "f64";
    case TERSE_DTYPE_I32:
      return "i32";
    case TERSE_DTYPE_I64:
      return "i64";
    case TERSE_DTYPE_U8:
      return "u8";
    case TERSE_DTYPE_I8:
      return "i8";
    default:
      return "dtype(" + std::to_string(t) + ")";
  }
}

// The dtype a C++ element type stands for, where that is unambiguous. 16-bit floats have no standard C++ type, so
// f16/bf16 are read through any 2-byte type (uint16_t, __half, ...) and only the size is checked for them.
template <class T>
inline constexpr terse_dtype_v1 kDtypeOf = -1;
template <>
inline constexpr terse_dtype_v1 kDtypeOf<float> = TERSE_DTYPE_F32;
template <>
inline constexpr terse_dtype_v1 kDtypeOf<double> = TERSE_DTYPE_F64;
template <>
inline constexpr terse_dtype_v1 kDtypeOf<int32_t> = TERSE_DTYPE_I32;
template <>
inline constexpr terse_dtype_v1 kDtypeOf<int64_t> = TERSE_DTYPE_I64;
template <>
inline constexpr terse_dtype_v1 kDtypeOf<uint8_t> = TERSE_DTYPE_U8;
template <>
inline constexpr terse_dtype_v1 kDtypeOf<int8_t> = TERSE_DTYPE_I8;

// Whether elements of type T may view a buffer of dtype t.
template <class T>
constexpr bool dtypeMatches(terse_dtype_v1 t) noexcept {
  if constexpr (kDtypeOf<T> >= 0) {
    return t == kDtypeOf<T>;
  } else {
    return sizeof(T) == dtypeSize(t);
  }
}

}  // namespace terse::sdk
