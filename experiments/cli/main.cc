// `terse`: the command line. git-style: `terse <command> [<args>]`, each command with its own --help. The dispatch
// table below is the one place a new subcommand is registered.
#include <dlfcn.h>

#include <array>
#include <iostream>
#include <string>
#include <string_view>
#include <vector>

#include "core/common/crash.h"
#include "core/common/cuda.h"
#include "core/plugin/compressor_plugin.h"
#include "core/plugin/scheduler.h"
#include "experiments/cli/commands.h"

namespace terse::cli {
namespace {

constexpr std::array kCommands{
    Command{"plugins", "list and inspect compressor and scheduler plugins", &pluginsCommand},
    Command{"bench", "communication benchmarks: links, allreduce, allgather", &benchCommand},
    Command{"run", "run a study (an experiment config; default: the quickstart)", &runCommand},
    Command{"compare", "compare result folders: tables, plots, provenance", &compareCommand},
    Command{"trace", "timelines: merge per-rank Chrome traces into one file", &traceCommand},
    Command{"launch", "start N ranks of a command on this host (a multi-process job)", &launchCommand},
    Command{"store", "serve a standalone rendezvous store for a multi-process job", &storeCommand},
    Command{"token", "print a fresh job token (for jobs that terse launch does not start)", &tokenCommand},
    Command{"config", "the experiment config field reference (README), from the schema's tables", &configCommand},
    Command{"whatif", "replay a recorded step trace on a simulated cluster of N workers", &whatifCommand},
};

// The allocator the process runs on (experiments/cli/CMakeLists.txt links jemalloc where the host has it): jemalloc
// answers mallctl("version"), found by name so that a binary without it still links and says so.
std::string allocatorName() {
  using Mallctl = int (*)(const char*, void*, std::size_t*, void*, std::size_t);
  auto mallctl = reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"));
  const char* version = nullptr;
  std::size_t size = sizeof(version);
  if (mallctl != nullptr && mallctl("version", &version, &size, nullptr, 0) == 0 && version != nullptr)
    return std::string("jemalloc ") + version;
  return "system malloc";
}

std::string versionList(const std::vector<uint32_t>& versions) {
  std::string out;
  for (uint32_t v : versions) out += (out.empty() ? "v" : ", v") + std::to_string(v);
  return out;
}

void printUsage(std::ostream& out) {
  out << "usage: terse [--version] [--help] <command> [<args>]\n\ncommands:\n";
  for (const auto& c : kCommands) {
    out << "  " << c.name << std::string(c.name.size() < 12 ? 12 - c.name.size() : 1, ' ') << c.summary << '\n';
  }
  out << "\n'terse <command> --help' describes a command.\n";
}

int run(int argc, char** argv) {
  const std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    printUsage(std::cerr);
    return kExitUsage;
  }
  const std::string& first = args.front();
  if (first == "--version" || first == "-V") {
    std::cout << "terse " << TERSE_VERSION << '\n'
              << "compressor ABI: " << versionList(CompressorPlugin::supportedAbiVersions()) << '\n'
              << "scheduler ABI: " << versionList(SchedulerPlugin::supportedAbiVersions()) << '\n';
    // Which GPU path this binary can take matters as much as its version when a result is reproduced.
    const cuda::DeviceSummary gpu = cuda::deviceSummary();
    std::cout << "cuda: " << (cuda::builtWithCuda() ? "built in" : "not built");
    if (!gpu.runtime.empty()) std::cout << " (" << gpu.runtime << ")";
    if (gpu.count > 0)
      std::cout << ", " << gpu.count << " device(s), device 0: " << gpu.first_name << '\n';
    else
      std::cout << ", no usable device: " << gpu.reason << '\n';
    // The allocator moves a simulation's host cost by a third (results/reference/simulation/cost_curve.md).
    std::cout << "allocator: " << allocatorName() << '\n';
    return kExitOk;
  }
  if (first == "--help" || first == "-h" || first == "help") {
    printUsage(std::cout);
    return kExitOk;
  }
  for (const auto& c : kCommands) {
    if (c.name == first) return c.run(std::vector<std::string>(args.begin() + 1, args.end()));
  }
  std::cerr << "terse: '" << first << "' is not a terse command\n\n";
  printUsage(std::cerr);
  return kExitUsage;
}

}  // namespace
}  // namespace terse::cli

int main(int argc, char** argv) {
  // A rank that dies of a fatal signal (a crashing plugin, a stack overflow) says so and marks its results failed.
  terse::crash::install();
  try {
    return terse::cli::run(argc, argv);
  } catch (const std::exception& e) {
    // Subcommands report their own errors; this is the last line of defence against an unexpected one.
    std::cerr << "terse: " << e.what() << '\n';
    return terse::cli::kExitFailure;
  }
}
