// The quickstart study (experiments/configs/quickstart.textproto), compiled in: the default a bare `terse run` runs,
// wherever it is started from.
#pragma once

#include <string_view>

namespace terse::experiments {

inline constexpr std::string_view kQuickstartSourceName = "quickstart.textproto";

// The file's text as it was at build time.
std::string_view quickstartConfigText() noexcept;

}  // namespace terse::experiments
