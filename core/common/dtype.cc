#include "core/common/dtype.h"

#include <array>
#include <utility>

namespace terse {

std::optional<DType> parseDType(std::string_view name) noexcept {
  static constexpr std::array<std::pair<std::string_view, DType>, 14> kNames{{
      {"f32", DType::kF32},
      {"fp32", DType::kF32},
      {"float32", DType::kF32},
      {"f16", DType::kF16},
      {"fp16", DType::kF16},
      {"half", DType::kF16},
      {"float16", DType::kF16},
      {"bf16", DType::kBF16},
      {"bfloat16", DType::kBF16},
      {"f64", DType::kF64},
      {"i32", DType::kI32},
      {"i64", DType::kI64},
      {"u8", DType::kU8},
      {"i8", DType::kI8},
  }};
  for (const auto& [n, t] : kNames)
    if (n == name) return t;
  return std::nullopt;
}

}  // namespace terse
