// The commit a pip-built wheel of the package was built from, which hook_results.cc records as the results'
// git_commit: "<40 hex digits>[-dirty]" or "unknown" in a wheel, empty in any other build (which asks git at run time).
// Defined in a file experiments/python/CMakeLists.txt generates at configure time (it says why then).
#pragma once

#include <string_view>

namespace terse::python {

std::string_view wheelCommit();

}  // namespace terse::python
