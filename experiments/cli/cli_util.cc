#include "experiments/cli/cli_util.h"

#include <boost/program_options/errors.hpp>

#include <algorithm>
#include <charconv>
#include <iostream>
#include <string>

#include "core/common/error.h"
#include "core/common/user_message.h"

namespace terse::cli {

uint64_t parseUnsigned(std::string_view option, std::string_view text) {
  uint64_t value = 0;
  const char* const end = text.data() + text.size();
  // from_chars takes no sign, space or exponent, and reports a value past the type's range.
  const auto [next, ec] = std::from_chars(text.data(), end, value);
  if (text.empty() || ec != std::errc() || next != end) {
    throw boost::program_options::error(std::string(option) + ": '" + std::string(text) +
                                        "' is not a decimal integer >= 0" +
                                        (ec == std::errc::result_out_of_range ? " below 2^64" : ""));
  }
  return value;
}

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
