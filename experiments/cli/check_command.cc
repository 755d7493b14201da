// `terse plugins check`: the conformance suite on one compressor, one line per check, exit 1 when any fails. And the
// payload-size table `terse plugins show --numel N` prints, measured by the same code that drives the suite.
#include "experiments/cli/check_command.h"

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "core/common/error.h"
#include "core/compress/wire_model.h"
#include "core/plugin/loader.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"

namespace terse::cli {
namespace {

namespace po = boost::program_options;

constexpr std::string_view kCheckUsage =
    "usage: terse plugins check NAME|PATH [--plugin-path DIR[:DIR...]]... [--param KEY=VALUE]...\n"
    "                           [--max-rel-error X] [--unbiased] [--seed S] [--only CHECK]...\n"
    "                           [--device host|cuda|cuda:N] [--check-timeout S] [--finite-limit X] [--in-process]\n"
    "\n"
    "Runs the compressor conformance suite: the plugin's contract (compressor_v1.h) checked in this process on f32\n"
    "host tensors of 0, 1, 1001 and 2^20 + 3 elements and 33x31 and 300x257 matrices, with 3 simulated ranks. Prints\n"
    "one line per check (PASS, FAIL or SKIP with what was measured) and exits 0 when no check fails, 1 otherwise.\n"
    "\n"
    "The round-trip error ||D(C(x)) - x|| / ||x|| on standard-normal inputs is only reported unless --max-rel-error\n"
    "gives a bound; unbiasedness is only reported unless --unbiased says the plugin claims it. Claimed, it is tested\n"
    "on 4 inputs of 16384 elements x 2 ranks with a sample size chosen so that a 5% bias along the input passes with\n"
    "probability below 1% (Stein's two-stage t-test; false alarm below 1e-4).\n"
    "\n"
    "Each check runs in a child process of its own: a plugin that crashes fails that check (\"crashed with SIGSEGV\n"
    "(Segmentation fault)\"), one that runs past --check-timeout seconds (default 60, 0: no limit) is stopped and\n"
    "fails it, naming the plugin call it was in, and the other checks still run. --in-process runs them all in this\n"
    "process, for a debugger; the device mode always does (a crash there ends the run, and the check named last on\n"
    "the output is the one that crashed).\n"
    "\n"
    "--device cuda (or cuda:N for device N) runs the same checks with every buffer the plugin sees in CUDA device\n"
    "memory, on a stream of the suite's own, guard zones checked on the device after each call. A plugin that does "
    "not\n"
    "advertise CUDA is not checked there (SKIP); a build or machine without CUDA is an error (exit 1).\n";

Params parseParams(const std::vector<std::string>& raw) {
  Params params;
  for (const auto& kv : raw) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) throw po::error("--param expects KEY=VALUE, got '" + kv + "'");
    params.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return params;
}

std::string checkList() {
  std::string out = "checks, in order:";
  std::size_t col = out.size();
  for (auto name : conformanceCheckNames()) {
    if (col + name.size() + 1 > 100) {
      out += "\n ";
      col = 1;
    }
    out += " " + std::string(name);
    col += name.size() + 1;
  }
  return out + "\n";
}

// "host", "cuda" or "cuda:N" -> (TERSE_DEVICE_*, index). Throws po::error for anything else.
std::pair<uint32_t, int> parseDevice(const std::string& text) {
  if (text == "host") return {TERSE_DEVICE_HOST, 0};
  if (text == "cuda") return {TERSE_DEVICE_CUDA, 0};
  if (text.rfind("cuda:", 0) == 0 && text.size() > 5 && text.size() <= 8 &&
      std::all_of(text.begin() + 5, text.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
    return {TERSE_DEVICE_CUDA, std::stoi(text.substr(5))};
  }
  throw po::error("--device expects host, cuda or cuda:N, got '" + text + "'");
}

std::string paramText(const Params& params) {
  std::string s;
  for (const auto& [k, v] : params) s += (s.empty() ? "" : " ") + k + "=" + v;
  return s.empty() ? "(none)" : s;
}

std::string fixed(double v, int digits) {
  std::ostringstream o;
  o << std::fixed << std::setprecision(digits) << v;
  return o.str();
}

}  // namespace

int checkCommand(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("plugin-path", po::value<std::vector<std::string>>()->composing(),
                                                    "search DIR first (repeatable, DIR:DIR...)")(
      "param", po::value<std::vector<std::string>>()->composing(), "KEY=VALUE passed to the plugin (repeatable)")(
      "max-rel-error", po::value<double>(), "fail round_trip above this relative error (default: report only)")(
      "unbiased",
      "the plugin claims E[D(C(x))] = x: fail when a test that catches a 5% bias with 99% power rejects it")(
      "seed", po::value<std::string>(), "seed of the inputs and the ranks' seeds (default 20240611)")(
      "only", po::value<std::vector<std::string>>()->composing(), "run only this check (repeatable)")(
      "device", po::value<std::string>(), "where the plugin's buffers live: host (default), cuda or cuda:N")(
      "check-timeout", po::value<double>(), "seconds a check may run before it fails (default 60, 0: no limit)")(
      "finite-limit", po::value<double>(), "largest |x| the plugin's range holds, for finite_decode (default 3e38)")(
      "in-process", "run every check in this process instead of a child each (for a debugger)");
  po::options_description hidden;
  hidden.add_options()("plugin", po::value<std::string>(), "NAME|PATH");
  po::options_description all;
  all.add(options).add(hidden);
  po::positional_options_description positional;
  positional.add("plugin", 1);

  po::variables_map vm;
  Params params;
  ConformanceOptions opts;
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << kCheckUsage << "\n" << options << "\n" << checkList();
      return kExitOk;
    }
    if (!vm.count("plugin")) throw po::error("missing NAME|PATH");
    if (vm.count("param")) params = parseParams(vm["param"].as<std::vector<std::string>>());
    if (vm.count("max-rel-error")) {
      const double bound = vm["max-rel-error"].as<double>();
      if (!(bound >= 0)) throw po::error("--max-rel-error must be >= 0");
      opts.max_rel_error = bound;
    }
    opts.claims_unbiased = vm.count("unbiased") > 0;
    opts.isolate = vm.count("in-process") == 0;
    if (vm.count("check-timeout")) {
      opts.check_timeout_s = vm["check-timeout"].as<double>();
      if (!(opts.check_timeout_s >= 0)) throw po::error("--check-timeout must be >= 0 seconds (0: no limit)");
    }
    if (vm.count("finite-limit")) {
      opts.finite_input_limit = vm["finite-limit"].as<double>();
      if (!(*opts.finite_input_limit > 0)) throw po::error("--finite-limit must be > 0");
    }
    if (vm.count("device")) std::tie(opts.device, opts.device_index) = parseDevice(vm["device"].as<std::string>());
    if (vm.count("seed")) opts.seed = parseUnsigned("--seed", vm["seed"].as<std::string>());
    if (vm.count("only")) {
      const auto names = conformanceCheckNames();
      for (const auto& n : vm["only"].as<std::vector<std::string>>()) {
        if (std::find(names.begin(), names.end(), n) == names.end())
          throw po::error("--only: no check named '" + n + "'");
        opts.only.push_back(n);
      }
    }
  } catch (const po::error& e) {
    std::cerr << "terse plugins check: " << e.what() << "\n\n" << kCheckUsage << "\n" << options;
    return kExitUsage;
  }

  // Before loading anything: a device mode this build or machine cannot run is an error, not a report of skips.
  if (const std::string problem = conformanceDeviceProblem(opts.device, opts.device_index); !problem.empty()) {
    std::cerr << "terse plugins check: --device " << vm["device"].as<std::string>() << ": " << problem << '\n';
    return kExitFailure;
  }

  const std::string target = vm["plugin"].as<std::string>();
  std::optional<PluginLoader> plugins =
      pluginLoader("plugins check", vm.count("plugin-path") ? vm["plugin-path"].as<std::vector<std::string>>()
                                                            : std::vector<std::string>{});
  if (!plugins) return kExitUsage;
  PluginLoader& loader = *plugins;
  std::shared_ptr<const CompressorPlugin> plugin;
  try {
    plugin = loader.loadCompressor(target);
  } catch (const std::exception& e) {
    std::cerr << "terse plugins check: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }

  std::cout << "checking compressor " << plugin->info().name << " (" << plugin->info().path.string() << ")\n"
            << "  parameters: " << paramText(params) << ", seed " << opts.seed << ", max relative error "
            << (opts.max_rel_error ? fixed(*opts.max_rel_error, 4) : std::string("not given")) << ", unbiased "
            << (opts.claims_unbiased ? "claimed" : "not claimed") << "\n";
  // The checks hold at any optimisation level, but a user about to time the plugin should hear it was built at -O0.
  if (const auto& optimized = plugin->info().optimized; optimized && !*optimized)
    std::cout << "  build: " << kNotOptimisedText << "\n";
  // Host output stays as it always was; the device mode says where the buffers are (instantiate names the device).
  if (opts.device == TERSE_DEVICE_CUDA) std::cout << "  buffers on CUDA device " << opts.device_index << "\n";
  std::size_t width = 0;
  for (auto n : conformanceCheckNames()) width = std::max(width, n.size());
  // The name goes out before the check runs, so that a crash inside the plugin leaves it as the last word printed.
  opts.on_check_start = [&](std::string_view name) {
    std::cout << "  " << name << std::string(width + 2 - name.size(), ' ') << std::flush;
  };
  opts.on_check_done = [&](const CheckResult& r) {
    std::cout << checkStatusName(r.status) << "  " << userMessage(r.message) << std::endl;
  };
  ConformanceReport report;
  try {
    report = checkCompressor(*plugin, params, opts);
  } catch (const std::exception& e) {
    std::cerr << "terse plugins check: " << userMessage(e.what()) << '\n';
    return kExitFailure;
  }
  std::cout << report.plugin << ": " << report.count(CheckStatus::kPass) << " passed, "
            << report.count(CheckStatus::kFail) << " failed, " << report.count(CheckStatus::kSkip) << " skipped\n";
  return report.passed() ? kExitOk : kExitFailure;
}

std::optional<ConformanceShape> shapeFromOptions(const std::optional<uint64_t>& numel,
                                                 const std::optional<std::string>& shape) {
  if (numel && shape) throw std::invalid_argument("give --numel or --shape, not both");
  if (numel) return ConformanceShape::flat(*numel);
  if (!shape) return std::nullopt;
  std::vector<int64_t> dims;
  std::stringstream in(*shape);
  std::string part;
  while (std::getline(in, part, 'x')) {
    std::size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != part.size() || part.empty() || v < 0) {
      throw std::invalid_argument("--shape expects sizes separated by 'x' (e.g. 300x257), got '" + *shape + "'");
    }
    dims.push_back(v);
  }
  if (dims.empty() || dims.size() > 4) throw std::invalid_argument("--shape takes 1 to 4 sizes, got '" + *shape + "'");
  ConformanceShape s;
  s.ndim = static_cast<int>(dims.size());
  s.numel = 1;
  for (std::size_t d = 0; d < dims.size(); ++d) {
    s.shape[d] = dims[d];
    s.numel *= static_cast<uint64_t>(dims[d]);
  }
  return s;
}

bool printPayloadSizes(std::ostream& out, const CompressorPlugin& plugin, const Params& params,
                       const ConformanceShape& shape, int world) {
  const uint64_t dense = 4 * shape.numel;
  out << "  payload for " << shape.label() << " f32 (" << shape.numel << " elements, dense " << dense << " B):\n";
  PayloadSizes sizes;
  try {
    sizes = measurePayloadSizes(plugin, params, shape);
  } catch (const std::exception& e) {
    out << "    not available: " << userMessage(e.what()) << '\n';
    return false;
  }
  // ratio: dense bytes per payload byte; bits/elem: what one element costs on the wire, headers and scales included.
  auto ratio_of = [](uint64_t num, uint64_t bytes) {
    return bytes == 0 ? std::string("-") : fixed(double(num) / double(bytes), 2) + "x";
  };
  auto ratio = [&](uint64_t bytes) { return ratio_of(dense, bytes); };
  auto bits = [&](uint64_t bytes) {
    return shape.numel == 0 ? std::string("-") : fixed(8.0 * double(bytes) / double(shape.numel), 3);
  };
  Table table({"ROUND", "MAX BYTES", "PRODUCED", "DENSE", "RATIO", "BITS/ELEM"});
  uint64_t max_total = 0, produced_total = 0;
  for (const auto& r : sizes.rounds) {
    // With several rounds only the total is a compression ratio; a round's share is in its bits per element.
    table.add({std::to_string(r.round), std::to_string(r.max_output_bytes), std::to_string(r.produced_bytes),
               std::to_string(dense), sizes.rounds.size() > 1 ? "-" : ratio(r.produced_bytes), bits(r.produced_bytes)});
    max_total += r.max_output_bytes;
    produced_total += r.produced_bytes;
  }
  if (sizes.rounds.size() > 1) {
    table.add({"all", std::to_string(max_total), std::to_string(produced_total), std::to_string(dense),
               ratio(produced_total), bits(produced_total)});
  }
  table.print(out, "    ");
  out << "    "
      << (sizes.caps.fixed_size ? "fixed size: every input gives MAX BYTES"
                                : "variable size: PRODUCED is for one standard-normal input; MAX BYTES is the bound")
      << "; RATIO = DENSE / PRODUCED\n";

  std::vector<RoundBytes> rounds;
  for (const auto& r : sizes.rounds) rounds.push_back({r.produced_bytes, r.sum_header_bytes});
  const uint64_t wire = modeledWireBytes(sizes.caps, rounds, world);
  const uint64_t dense_wire = denseWireBytes(shape.numel, world);
  const bool sum = sizes.caps.aggregation == Aggregation::kSum;
  out << "  wire per worker per step at " << world << (world == 1 ? " worker" : " workers") << " ("
      << aggregationName(sizes.caps.aggregation) << ": "
      << (sum ? "ring allreduce of the payload after its header, 2(n-1)/n of it"
              : "the n-1 other workers' payloads" + std::string(sizes.caps.fixed_size ? "" : " and their sizes"))
      << (sizes.rounds.size() > 1 ? ", every round" : "") << "):\n";
  Table wire_table({"PLUGIN WIRE", "DENSE WIRE", "WIRE RATIO"});
  wire_table.add({std::to_string(wire), std::to_string(dense_wire), ratio_of(dense_wire, wire)});
  wire_table.print(out, "    ");
  out << "    DENSE WIRE: a ring allreduce of the " << dense << " B f32 tensor; WIRE RATIO = DENSE WIRE / PLUGIN WIRE\n"
      << "    (a flat world, without frame headers: an allgather's ring and Bruck's move the same bytes per worker;\n"
      << "    the hierarchical allgather of multi-node worlds others; `terse compare` measures the frames, headers "
         "included)\n";
  return true;
}

}  // namespace terse::cli
