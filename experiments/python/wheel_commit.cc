#include "experiments/python/wheel_commit.h"

namespace terse::python {

// TERSE_WHEEL_COMMIT is set on this file alone, and only in a wheel's build (experiments/python/CMakeLists.txt says
// why): a new commit recompiles these lines, not the extension.
std::string_view wheelCommit() {
#ifdef TERSE_WHEEL_COMMIT
  return TERSE_WHEEL_COMMIT;
#else
  return {};
#endif
}

}  // namespace terse::python
