// The commit a pip-built wheel of the package was built from, which hook_results.cc records as the results'
// git_commit: "<40 hex digits>[-dirty]" or "unknown" in a wheel, empty in any other build (which asks git at run time).
// Defined in wheel_commit.cc, from the commit experiments/python/CMakeLists.txt finds at a wheel's configure time.
#pragma once

#include <string_view>

namespace terse::python {

std::string_view wheelCommit();

}  // namespace terse::python
