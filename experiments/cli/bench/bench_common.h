// What the `terse bench` benchmarks share: their common options (world sizes, message sizes, iterations, transport,
// link emulation), the size sweep, the threads that play ranks, and the benchmarks' entry points that
// bench_command.cc dispatches to, one file each.
#pragma once

#include <boost/program_options.hpp>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/comm/inproc_transport.h"

namespace terse::cli::bench {

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

// `terse bench links` (links_command.cc).
int linksCommand(const std::vector<std::string>& args);
// `terse bench allreduce` and `terse bench allgather` (collective_command.cc).
int collectiveCommand(bool allreduce, const std::vector<std::string>& args);

struct CommonArgs {
  std::vector<int> ranks{2};
  uint64_t min_bytes = 4096;
  uint64_t max_bytes = 64ull << 20;
  double step_factor = 2;
  int iters = 20;
  int warmup = 5;
  bool json = false;
  bool check = false;
  std::string transport = "inproc";
  comm::InprocOptions inproc;
};

// The options every benchmark takes; the defaults that differ per benchmark are commonArgs' arguments.
void addCommonOptions(po::options_description& o);

// Fills args from vm; throws po::error for bad values (reported as usage errors).
CommonArgs commonArgs(const po::variables_map& vm, uint64_t min_default, uint64_t max_default, double step_default,
                      int iters_default);

// Parses `args` for `terse bench <who>`. nullopt when the command is done: --help printed (exit_code kExitOk) or a
// usage error reported (kExitUsage).
std::optional<po::variables_map> parse(const std::vector<std::string>& args, const po::options_description& options,
                                       std::string_view usage, const std::string& who, int& exit_code);

// The message sizes from min_bytes to max_bytes by step_factor, each a multiple of `align` (at least `align`).
std::vector<uint64_t> sizeSweep(const CommonArgs& a, uint64_t align);

std::string fixed(double v, int digits);

// Runs fn(rank) on one thread per rank and rethrows the first error.
void onRanks(int n, const std::function<void(int)>& fn);

}  // namespace terse::cli::bench
