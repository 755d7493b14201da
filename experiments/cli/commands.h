// The `terse` subcommands. Each lives in its own file and is one row of the dispatch table in main.cc, so a new
// subcommand (run, compare, bench) is a new file plus a row.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace terse::cli {

// Exit codes shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;  // the command ran and failed (a plugin did not load, a run broke)
inline constexpr int kExitUsage = 2;    // unknown subcommand or option, missing or malformed argument

// `args` are the words after the subcommand's name.
using CommandFn = int (*)(const std::vector<std::string>& args);

struct Command {
  std::string_view name;
  std::string_view summary;  // one line for `terse --help`
  CommandFn run;
};

int pluginsCommand(const std::vector<std::string>& args);  // plugins_command.cc
int benchCommand(const std::vector<std::string>& args);    // bench/bench_command.cc
int runCommand(const std::vector<std::string>& args);      // run_command.cc
int compareCommand(const std::vector<std::string>& args);  // compare_command.cc
int traceCommand(const std::vector<std::string>& args);    // trace_command.cc
int launchCommand(const std::vector<std::string>& args);   // launch_command.cc
int storeCommand(const std::vector<std::string>& args);    // launch_command.cc
int tokenCommand(const std::vector<std::string>& args);    // token_command.cc
int configCommand(const std::vector<std::string>& args);   // config_command.cc
int whatifCommand(const std::vector<std::string>& args);   // whatif_command.cc

}  // namespace terse::cli
