// `terse token`: prints one fresh job token (core/comm/auth.h) and a newline. terse accepts no other kind of token --
// not a pass phrase, not `openssl rand -hex 32` -- so this is how a job that `terse launch` does not start (SLURM,
// OpenMPI, a standalone `terse store`) gets its secret:
//   (umask 077; terse token > ~/.terse_token)
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/comm/auth.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"

namespace terse::cli {
namespace {

constexpr std::string_view kTokenUsage =
    "usage: terse token\n"
    "\n"
    "Prints a fresh job token (256 random bits and a checksum) for the ranks of a job that `terse launch` does not\n"
    "start; every rank gets the same one, through TERSE_JOB_TOKEN or a file named by TERSE_JOB_TOKEN_FILE, e.g.\n"
    "  (umask 077; terse token > ~/.terse_token)\n"
    "  TERSE_JOB_TOKEN_FILE=~/.terse_token srun -N 2 terse run study.textproto\n"
    "terse accepts only tokens made this way (or by `terse launch`): a token a person chooses, or one another tool\n"
    "prints, is refused, since whoever gets a rank to connect to it could test guesses of it offline.\n";

}  // namespace

int tokenCommand(const std::vector<std::string>& args) {
  if (args.size() == 1 && (args[0] == "--help" || args[0] == "-h")) {
    std::cout << kTokenUsage;
    return kExitOk;
  }
  if (!args.empty()) {
    std::cerr << "terse token: takes no arguments, got '" << args[0] << "'\n\n" << kTokenUsage;
    return kExitUsage;
  }
  try {
    // The token goes to stdout alone, so that `terse token > FILE` and `$(terse token)` take it whole.
    std::cout << comm::JobToken::generate().secret() << '\n' << std::flush;
    return std::cout ? kExitOk : kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << "terse token: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
}

}  // namespace terse::cli
