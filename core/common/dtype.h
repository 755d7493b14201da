// Element types as the core sees them: the ABI's terse_dtype_v1 values with names and sizes.
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include "terse/types_v1.h"

namespace terse {

enum class DType : int32_t {
  kF32 = TERSE_DTYPE_F32,
  kF16 = TERSE_DTYPE_F16,
  kBF16 = TERSE_DTYPE_BF16,
  kF64 = TERSE_DTYPE_F64,
  kI32 = TERSE_DTYPE_I32,
  kI64 = TERSE_DTYPE_I64,
  kU8 = TERSE_DTYPE_U8,
  kI8 = TERSE_DTYPE_I8,
};

// Bytes per element; 0 for a value outside the enumeration (untrusted input is checked with isValidDType first).
constexpr std::size_t dtypeSize(DType t) noexcept {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
      return 2;
    case DType::kBF16:
      return 2;
    case DType::kF64:
      return 8;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
    case DType::kU8:
      return 1;
    case DType::kI8:
      return 1;
  }
  return 0;
}

constexpr bool isValidDType(int32_t raw) noexcept {
  return raw >= 0 && raw < TERSE_DTYPE_COUNT_V1;
}

constexpr std::string_view dtypeName(DType t) noexcept {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kF64:
      return "f64";
    case DType::kI32:
      return "i32";
    case DType::kI64:
      return "i64";
    case DType::kU8:
      return "u8";
    case DType::kI8:
      return "i8";
  }
  return "?";
}

// Parses "f32", "fp32", "float32", "f16", "fp16", "half", "bf16", ...; nullopt for anything else.
std::optional<DType> parseDType(std::string_view name) noexcept;

// Floating-point types the gradient path handles.
constexpr bool isFloat(DType t) noexcept {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF64;
}

}  // namespace terse
