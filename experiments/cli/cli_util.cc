#include "experiments/cli/cli_util.h"

#include <algorithm>
#include <iostream>

#include "core/common/error.h"
#include "core/common/user_message.h"

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
  return withoutSourceLocations(what);
}

std::optional<PluginLoader> pluginLoader(std::string_view command, const std::vector<std::string>& plugin_path_args,
                                         std::string* error) {
  try {
    return PluginLoader(plugin_path_args);
  } catch (const InvalidArgument& e) {
    const std::string message = userMessage(e.what());
    std::cerr << "terse " << command << ": " << message << '\n';
    if (error != nullptr) *error = message;
    return std::nullopt;
  }
}

}  // namespace terse::cli
