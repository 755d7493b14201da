#include "core/plugin/compressor.h"

namespace terse {

std::string_view aggregationName(Aggregation a) noexcept {
  switch (a) {
    case Aggregation::kAllgather:
      return "allgather";
    case Aggregation::kSum:
      return "sum";
    case Aggregation::kCustom:
      return "custom";
  }
  return "?";
}

std::string_view wireDtypeText(const CompressorCaps& caps) noexcept {
  return caps.aggregation == Aggregation::kSum ? dtypeName(caps.wire_dtype) : "-";
}

}  // namespace terse
