// Number and list text shared by the compare library's files (text.h).
#include "results/compare/text.h"

#include <cstdio>
#include <iomanip>
#include <sstream>

namespace terse::results::detail {

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

std::string fullPrecision(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

std::string joinLines(const std::vector<std::string>& v, std::string_view sep) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : std::string(sep)) + s;
  return out;
}

}  // namespace terse::results::detail
