#include "core/comm/spin_wait.h"

#include <charconv>
#include <cstdint>

#include "core/common/error.h"

namespace terse::comm {

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
