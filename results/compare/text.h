// Internal to the compare library: number and list text that more than one of its files prints.
#pragma once

#include "results/compare/room.h"  // the room's guard

#include <string>
#include <string_view>
#include <vector>

namespace terse::results::detail {

// `v` with `digits` digits after the point.
std::string fixed(double v, int digits);

// `v` as printf's %.10g: full precision for CSV, provenance values and plot data, without trailing zeros.
std::string fullPrecision(double v);

// The strings of `v` joined by `sep`.
std::string joinLines(const std::vector<std::string>& v, std::string_view sep);

}  // namespace terse::results::detail
