// `terse bench`: communication benchmarks in nccl-tests' format (docs/STYLE.md 10), one file per benchmark; this one
// dispatches to them.
//
//   terse bench links       achieved bandwidth and latency of emulated links against the configured ones
//                           (links_command.cc)
//   terse bench allreduce   size, count, type, algo, time, algbw, busbw (2(n-1)/n), #wrong (collective_command.cc;
//                           --transport nccl: nccl_collective.cc)
//   terse bench allgather   the same with busbw = algbw * (n-1)/n
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "experiments/cli/bench/bench_common.h"
#include "experiments/cli/commands.h"

namespace terse::cli {
namespace {

constexpr std::string_view kBenchUsage =
    "usage: terse bench <benchmark> [<args>]\n"
    "\n"
    "benchmarks:\n"
    "  links       achieved bandwidth and latency of emulated links against the configured ones\n"
    "  allreduce   allreduce time, algbw and busbw per message size (nccl-tests format)\n"
    "  allgather   allgather time, algbw and busbw per message size (nccl-tests format)\n"
    "\n"
    "'terse bench <benchmark> --help' lists its options.\n";

}  // namespace

int benchCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cerr << kBenchUsage;
    return kExitUsage;
  }
  const std::string& sub = args.front();
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "--help" || sub == "-h") {
    std::cout << kBenchUsage;
    return kExitOk;
  }
  if (sub == "links") return bench::linksCommand(rest);
  if (sub == "allreduce") return bench::collectiveCommand(true, rest);
  if (sub == "allgather") return bench::collectiveCommand(false, rest);
  std::cerr << "terse bench: '" << sub << "' is not a benchmark\n\n" << kBenchUsage;
  return kExitUsage;
}

}  // namespace terse::cli
