#include "experiments/cli/cli_util.h"

#include <algorithm>

namespace terse::cli {

void Table::print(std::ostream& out, std::string_view indent) const {
  std::vector<std::size_t> width(header_.size(), 0);
  auto measure = [&](const std::vector<std::string>& row) {
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) width[i] = std::max(width[i], row[i].size());
  };
  measure(header_);
  for (const auto& r : rows_) measure(r);
  auto line = [&](const std::vector<std::string>& row) {
    std::string s(indent);
    for (std::size_t i = 0; i < row.size() && i < width.size(); ++i) {
      s += row[i];
      if (i + 1 < row.size()) s += std::string(width[i] - row[i].size() + 2, ' ');
    }
    out << s << '\n';
  };
  line(header_);
  for (const auto& r : rows_) line(r);
}

std::string userMessage(std::string_view what) {
  // Drops every "[<file>:<line>] " (a message may embed another error's text, e.g. "needs parameters: [..] ...").
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

}  // namespace terse::cli
