// How the conformance suite words what it measured: every CheckResult message is built from these, so numbers print
// alike (three significant digits) in every check.
#pragma once

#include <cstddef>
#include <iomanip>
#include <sstream>
#include <string>
#include <string_view>

#include "core/conformance/conformance.h"

namespace terse::conformance {

template <class... Parts>
std::string cat(const Parts&... parts) {
  std::ostringstream o;
  o << std::setprecision(3);
  (o << ... << parts);
  return o.str();
}

inline std::string plural(std::size_t n, std::string_view one, std::string_view many) {
  return std::to_string(n) + " " + std::string(n == 1 ? one : many);
}

// How messages name a tensor: "numel 1001", "shape 300x257".
inline std::string tag(const ConformanceShape& s) {
  return (s.ndim == 0 ? "numel " : "shape ") + s.label();
}

}  // namespace terse::conformance
