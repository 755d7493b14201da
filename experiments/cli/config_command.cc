// `terse config reference [--write FILE]`: the field reference of experiment configs, generated from the tables that
// fill the defaults and check the values (experiments/config/config_fields.cc), so that the README cannot drift from
// what the loader does. tests/config's ReadmeReferenceIsGenerated fails when the committed README differs.
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"
#include "experiments/config/config.h"

namespace terse::cli {
namespace {

constexpr std::string_view kConfigUsage =
    "usage: terse config reference [--write FILE]\n"
    "\n"
    "Prints the field reference of experiment configs in Markdown: each section's fields with their defaults, the\n"
    "values they accept and what they mean, then the checks across fields. With --write, replaces the generated\n"
    "section of FILE (between its BEGIN and END marker lines) instead, e.g.\n"
    "  terse config reference --write experiments/configs/README.md\n";

int usageError(const std::string& what) {
  std::cerr << "terse config: " << what << "\n\n" << kConfigUsage;
  return kExitUsage;
}

int writeInto(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::cerr << "terse config reference: cannot read " << path << '\n';
    return kExitFailure;
  }
  std::stringstream text;
  text << in.rdbuf();
  in.close();
  const std::string updated = experiments::withConfigReference(text.str(), path);
  if (updated == text.str()) {
    std::cout << path << ": the reference is up to date\n";
    return kExitOk;
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << updated;
  out.flush();
  if (!out) {
    std::cerr << "terse config reference: cannot write " << path << '\n';
    return kExitFailure;
  }
  std::cout << path << ": reference regenerated\n";
  return kExitOk;
}

}  // namespace

int configCommand(const std::vector<std::string>& args) {
  if (args.empty()) return usageError("missing subcommand (reference)");
  if (args[0] == "--help" || args[0] == "-h") {
    std::cout << kConfigUsage;
    return kExitOk;
  }
  if (args[0] != "reference") return usageError("unknown subcommand '" + args[0] + "'");
  try {
    if (args.size() == 1) {
      std::cout << experiments::configReference();
      return kExitOk;
    }
    if (args.size() == 3 && args[1] == "--write") return writeInto(args[2]);
    if (args.size() == 2 && (args[1] == "--help" || args[1] == "-h")) {
      std::cout << kConfigUsage;
      return kExitOk;
    }
    return usageError("unexpected arguments after 'reference' (only --write FILE)");
  } catch (const std::exception& e) {
    std::cerr << "terse config reference: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
}

}  // namespace terse::cli
