// Small helpers shared by the subcommands: aligned text tables and user-facing error text.
#pragma once

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/plugin/loader.h"

namespace terse::cli {

// A left-aligned text table; columns are as wide as their widest cell, two spaces apart.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : header_(std::move(header)) {}
  void add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  bool empty() const { return rows_.empty(); }
  void print(std::ostream& out, std::string_view indent = "") const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

// What `terse plugins show` and `terse plugins check` say of a plugin compiled without optimisation
// (PluginInfo::optimized): a benchmark of it measures the build, not the method.
inline constexpr std::string_view kNotOptimisedText =
    "NOT optimised: compiled at -O0, its loops run several times slower than an optimised build's; rebuild it with "
    "-DCMAKE_BUILD_TYPE=Release";

// `text` as an unsigned decimal integer, all of it: "-1", "+3", " 5", "1e6", "0x10" and values past 2^64 - 1 throw
// boost::program_options::error (a usage error, as the commands report theirs) naming `option` ("--numel: '-1' is not a
// decimal integer >= 0"). Boost's parser of a uint64_t option takes "-1" as 2^64 - 1 (lexical_cast's wrap-around),
// which a command would then act on.
uint64_t parseUnsigned(std::string_view option, std::string_view text);

// An exception's message without the "[core/plugin/x.cc:123] " locations that terse errors carry: they help a
// developer reading a log, not a user reading `terse plugins show`.
std::string userMessage(std::string_view what);

// The loader of a command with --plugin-path arguments (each DIR or DIR:DIR...). nullopt when one of them is not a
// folder: the loader's message is then printed as "terse <command>: ...", and stored in `error` when given, and the
// command exits with kExitUsage.
std::optional<PluginLoader> pluginLoader(std::string_view command, const std::vector<std::string>& plugin_path_args,
                                         std::string* error = nullptr);

}  // namespace terse::cli
