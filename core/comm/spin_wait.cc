#include "core/comm/spin_wait.h"

#include <sched.h>

#include <algorithm>
#include <charconv>
#include <cstdint>

#include "core/common/error.h"

namespace terse::comm {

SpinStalls& threadSpinStalls() {
  thread_local SpinStalls stalls;
  return stalls;
}

int currentCpu() {
  return ::sched_getcpu();
}

int allowedCpus() {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (::sched_getaffinity(0, sizeof allowed, &allowed) != 0) return 1;
  return std::max(1, CPU_COUNT(&allowed));
}

bool moveToAnotherCpu(int from) {
  cpu_set_t allowed;
  CPU_ZERO(&allowed);
  if (from < 0 || ::sched_getaffinity(0, sizeof allowed, &allowed) != 0 || CPU_COUNT(&allowed) < 2) return false;
  int target = -1;
  for (int k = 1; k < CPU_SETSIZE && target < 0; ++k) {
    const int c = (from + k) % CPU_SETSIZE;
    if (CPU_ISSET(c, &allowed)) target = c;
  }
  cpu_set_t one;
  CPU_ZERO(&one);
  CPU_SET(target, &one);
  // Narrowing the affinity migrates the running thread before the call returns; widening it again leaves it there.
  if (::sched_setaffinity(0, sizeof one, &one) != 0) return false;
  ::sched_setaffinity(0, sizeof allowed, &allowed);
  return true;
}

int resolveSpinMicroseconds(int option, std::string_view who, std::string_view field, const char* name,
                            const EnvLookup& env, int fallback, std::string_view meaning) {
  TERSE_CHECK(
      option >= -1 && option <= kMaxSpinUs, InvalidArgument,
      who << ": " << field << " must be -1 (unset), 0 (off) or 1.." << kMaxSpinUs << " microseconds, got " << option);
  if (option >= 0) return option;
  const auto text = env(name);
  if (!text) return fallback;
  int64_t v = 0;
  const char* end = text->data() + text->size();
  const auto [ptr, ec] = std::from_chars(text->data(), end, v);
  TERSE_CHECK(!text->empty() && ec == std::errc() && ptr == end && v >= 0 && v <= kMaxSpinUs, InvalidArgument,
              name << "='" << *text << "': expected 0 (off) or 1.." << kMaxSpinUs << " (" << meaning << ")");
  return static_cast<int>(v);
}

}  // namespace terse::comm
