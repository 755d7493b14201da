// What a user reads of an error: its message without the "[<file>:<line>] " that TERSE_THROW puts in front of it (and
// of any message it embeds). The CLI prints messages so, and the Python package raises them so; the location helps a
// developer reading terse's sources, not a user reading a message.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace terse {

inline std::string withoutSourceLocations(std::string_view what) {
  std::string out;
  std::size_t i = 0;
  while (i < what.size()) {
    if (what[i] == '[') {
      const auto close = what.find("] ", i);
      const auto colon = what.find(':', i);
      if (close != std::string_view::npos && colon != std::string_view::npos && colon < close && colon > i + 1 &&
          what.substr(i, close - i).find(' ') == std::string_view::npos) {
        const std::string_view line = what.substr(colon + 1, close - colon - 1);
        if (!line.empty() && line.find_first_not_of("0123456789") == std::string_view::npos) {
          i = close + 2;
          continue;
        }
      }
    }
    out.push_back(what[i++]);
  }
  return out;
}

}  // namespace terse
