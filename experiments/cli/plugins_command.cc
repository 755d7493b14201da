// `terse plugins list` and `terse plugins show`: what the loader finds, where, and why a file cannot be used.
#include <algorithm>
#include <boost/program_options.hpp>
#include <filesystem>
#include <iostream>
#include <optional>
#include <sstream>

#include "core/common/error.h"
#include "core/plugin/loader.h"
#include "experiments/cli/check_command.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"

namespace terse::cli {
namespace {

namespace po = boost::program_options;

constexpr std::string_view kPluginsUsage =
    "usage: terse plugins <subcommand> [<args>]\n"
    "\n"
    "subcommands:\n"
    "  list   every compressor and scheduler plugin in the search directories, broken files included\n"
    "  show   everything known about one plugin: path, ABI, version, description, caps per dtype\n"
    "  check  run the conformance suite on one compressor plugin\n"
    "\n"
    "Plugins are searched in: --plugin-path directories, TERSE_PLUGIN_PATH (colon-separated), this installation's\n"
    "<prefix>/lib/terse/plugins, then the build tree (only by a terse that runs from it). The first file with a name\n"
    "wins.\n";

constexpr std::string_view kListUsage = "usage: terse plugins list [--plugin-path DIR[:DIR...]]...\n";
constexpr std::string_view kShowUsage =
    "usage: terse plugins show NAME|PATH [--plugin-path DIR[:DIR...]]... [--param KEY=VALUE]...\n"
    "                          [--kind compressor|scheduler] [--numel N | --shape D0xD1[x..]] [--world W]\n"
    "\n"
    "NAME is looked up in the search directories; an argument containing '/' or ending in .so is a file path.\n"
    "--param values are passed to the plugin's init (needed to show caps of a plugin with required parameters).\n"
    "--numel / --shape add a compressor's exact payload bytes per round for that f32 tensor beside its dense size,\n"
    "and the bytes one worker sends per step at --world W workers (default 4) under the plugin's aggregation beside\n"
    "a dense f32 ring allreduce's: the payload ratio is not the wire ratio (docs/compressors-and-schedulers.md).\n";

// The quickstart's worker count (experiments/configs/quickstart.textproto): the wire bytes a newcomer first compares.
constexpr int kDefaultWorld = 4;

std::string hexDevices(uint32_t devices) {
  std::string out;
  if (devices & TERSE_DEVICE_HOST) out += "host";
  if (devices & TERSE_DEVICE_CUDA) out += out.empty() ? "cuda" : ",cuda";
  return out.empty() ? "-" : out;
}

std::string abiName(uint32_t v) {
  return "v" + std::to_string(v);
}

std::string yesNo(bool b) {
  return b ? "yes" : "no";
}

// Parses options without positional arguments; on a usage error prints it with `usage` and sets exit_code to
// kExitUsage, on --help prints the help and sets kExitOk; returns nullopt in both cases.
std::optional<po::variables_map> parse(const std::vector<std::string>& args, const po::options_description& options,
                                       std::string_view usage, int& exit_code) {
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(options).run(), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "terse plugins: " << e.what() << "\n\n" << usage << "\n" << options;
    exit_code = kExitUsage;
    return std::nullopt;
  }
  if (vm.count("help")) {
    std::cout << usage << "\n" << options;
    exit_code = kExitOk;
    return std::nullopt;
  }
  return vm;
}

std::vector<std::string> pluginPaths(const po::variables_map& vm) {
  return vm.count("plugin-path") ? vm["plugin-path"].as<std::vector<std::string>>() : std::vector<std::string>{};
}

void printSearchDirs(std::ostream& out, const std::vector<SearchDir>& dirs) {
  out << "search directories, in order:\n";
  for (const auto& d : dirs) {
    out << "  " << d.dir.string() << " (" << d.origin << (d.exists ? "" : ", does not exist") << ")\n";
  }
}

// ---- list

int listCommand(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("plugin-path", po::value<std::vector<std::string>>()->composing(),
                                                    "search DIR first (repeatable, DIR:DIR...)");
  int exit_code = kExitOk;
  auto vm = parse(args, options, kListUsage, exit_code);
  if (!vm) return exit_code;

  std::optional<PluginLoader> plugins = pluginLoader("plugins list", pluginPaths(*vm));
  if (!plugins) return kExitUsage;
  const PluginLoader& loader = *plugins;
  const auto dirs = loader.searchDirs();
  const bool any_dir = std::any_of(dirs.begin(), dirs.end(), [](const SearchDir& d) { return d.exists; });
  const auto found = loader.discover();

  Table table({"NAME", "KIND", "ABI", "DEVICES", "AGGREGATION", "ROUNDS", "CREDIT", "STATUS", "PATH"});
  std::vector<std::string> notes;
  for (const auto& e : found) {
    const std::string abi = e.info ? abiName(e.info->abi_version) : "-";
    std::string devices = "-", aggregation = "-", rounds = "-", credit = "-";
    if (e.compressor_caps) {
      devices = hexDevices(e.compressor_caps->devices);
      aggregation = std::string(aggregationName(e.compressor_caps->aggregation));
      rounds = std::to_string(e.compressor_caps->num_rounds);
    }
    if (e.scheduler_caps) {
      const uint64_t bytes = e.scheduler_caps->credit_bytes;
      credit = bytes ? std::to_string(bytes) + " B" : "unlimited";
    }
    // Errors name the file themselves; the other notes get the path here.
    std::string status = "ok";
    auto note = [&](std::string label, const std::string& text) {
      notes.push_back("[" + std::to_string(notes.size() + 1) + "] " + e.name + ": " + text);
      status = std::move(label) + " [" + std::to_string(notes.size()) + "]";
    };
    if (!e.error.empty()) {
      note("error", userMessage(e.error));
    } else if (e.shadowed_by) {
      note("shadowed",
           e.path.string() + " is shadowed by " + e.shadowed_by->string() + ", which loading by name picks");
    } else if (!e.note.empty()) {
      note("note", userMessage(e.note));
    }
    table.add({e.name, std::string(pluginKindName(e.kind)), abi, devices, aggregation, rounds, credit, status,
               e.path.string()});
  }

  if (table.empty()) {
    std::cout << "no plugins found\n";
  } else {
    table.print(std::cout);
  }
  if (!notes.empty()) {
    std::cout << "\nnotes:\n";
    for (const auto& n : notes) std::cout << "  " << n << '\n';
  }
  std::cout << '\n';
  printSearchDirs(std::cout, dirs);
  if (!any_dir) {
    std::cerr << "terse plugins list: none of the search directories exists\n";
    return kExitFailure;
  }
  return kExitOk;
}

// ---- show

Params parseParams(const std::vector<std::string>& raw) {
  Params params;
  for (const auto& kv : raw) {
    const auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) {
      throw po::error("--param expects KEY=VALUE, got '" + kv + "'");
    }
    params.emplace_back(kv.substr(0, eq), kv.substr(eq + 1));
  }
  return params;
}

std::string buildText(const PluginInfo& info) {
  if (!info.optimized) {
    return "not reported (the file exports no terse_" + std::string(pluginKindName(info.kind)) +
           "_build_info_v1: a plugin in C, or built before terse reported it)";
  }
  return *info.optimized ? "optimised" : std::string(kNotOptimisedText);
}

void printInfo(std::ostream& out, const PluginInfo& info, const Params& params) {
  out << pluginKindName(info.kind) << " " << info.name << '\n'
      << "  path:         " << info.path.string() << '\n'
      << "  found:        " << (info.origin == kOriginPath ? "given as a path" : "in " + info.origin) << '\n'
      << "  ABI:          " << abiName(info.abi_version) << '\n'
      << "  version:      " << (info.version.empty() ? "(none)" : info.version) << '\n'
      << "  build:        " << buildText(info) << '\n'
      << "  description:  " << (info.description.empty() ? "(none)" : info.description) << '\n';
  for (const auto& s : info.shadowed) out << "  shadows:      " << s.string() << '\n';
  if (!params.empty()) {
    out << "  parameters:  ";
    for (const auto& [k, v] : params) out << ' ' << k << '=' << v;
    out << '\n';
  }
}

// Prints caps for the gradient dtypes the trainer uses; returns false when the plugin broke its contract or the given
// parameters were rejected.
bool showCompressor(std::ostream& out, const CompressorPlugin& plugin, const Params& params) {
  printInfo(out, plugin.info(), params);
  std::shared_ptr<Compressor> instance;
  try {
    instance = plugin.instantiate(params);
  } catch (const std::exception& e) {
    out << "  caps:         not available: " << userMessage(e.what()) << '\n';
    if (params.empty()) out << "                (pass parameters with --param KEY=VALUE)\n";
    return params.empty() && dynamic_cast<const PluginError*>(&e) == nullptr;
  }
  // The parameters the instance read, defaults included (terse/resolved_params_v1.h): the names a config's params and
  // the hook's keywords take, which the description need not list.
  if (const std::optional<Params> resolved = instance->resolvedParams()) {
    out << "  resolved:    ";
    if (resolved->empty()) out << " (none: the plugin takes no parameters)";
    for (const auto& [k, v] : *resolved) out << ' ' << k << '=' << v;
    if (params.empty() && !resolved->empty()) out << "  (the defaults; change with --param KEY=VALUE)";
    out << '\n';
  } else {
    out << "  resolved:     not reported (the file exports no terse_compressor_resolved_params_v1)\n";
  }
  // Whether a CUDA decompress can leave its payload check's verdict on the device (terse/device_verdict_v1.h), which
  // spares the synchronization a tensor that reading it would cost.
  out << "  verdicts:     "
      << (instance->defersVerdicts()
              ? "deferred on request (terse_compressor_decompress_deferred_v1)"
              : "returned by decompress (the file exports no terse_compressor_decompress_deferred_v1)")
      << '\n';
  // The same for a multi-round compress's check of prev, the aggregate of the round before (PowerSGD's round 1); a
  // plugin of one round has no prev to check.
  int rounds = 1;
  try {
    rounds = instance->caps(DType::kF32).num_rounds;
  } catch (const std::exception&) {
    // Caps of f32 refused: the table below says so.
  }
  out << "  prev checks:  "
      << (rounds == 1 ? "none (one round: no prev)"
          : instance->defersPrevVerdicts()
              ? "deferred on request (terse_compressor_compress_deferred_v1)"
              : "returned by compress (the file exports no terse_compressor_compress_deferred_v1)")
      << '\n';
  // Where the work of a call changes with the step (terse/phases_v1.h), which a CALIBRATED simulation times apiece.
  if (const std::span<const uint64_t> phases = instance->phaseSteps(); !phases.empty()) {
    out << "  phases:       from step 0";
    for (const uint64_t s : phases) out << ", " << s;
    out << " (a CALIBRATED simulation times a step of each)\n";
  }
  bool ok = true;
  Table table({"DTYPE", "DEVICES", "AGGREGATION", "WIRE", "FIXED", "STATEFUL", "SHARED_SEED", "IDENTITY", "ROUNDS"});
  std::vector<std::string> other;
  for (DType d : {DType::kF32, DType::kF16, DType::kBF16}) {
    try {
      const CompressorCaps c = instance->caps(d);
      table.add({std::string(dtypeName(d)), hexDevices(c.devices), std::string(aggregationName(c.aggregation)),
                 std::string(wireDtypeText(c)), yesNo(c.fixed_size), yesNo(c.stateful), yesNo(c.shared_seed),
                 yesNo(c.identity), std::to_string(c.num_rounds)});
    } catch (const Unsupported& e) {
      // Only the plugin's own reason: the label and call in front are the same for every row.
      const std::string m = userMessage(e.what());
      const std::string marker = "[unsupported]: ";
      const auto at = m.find(marker);
      other.push_back(std::string(dtypeName(d)) + ": unsupported" +
                      (at == std::string::npos ? " (" + m + ")" : ": " + m.substr(at + marker.size())));
    } catch (const std::exception& e) {
      other.push_back(std::string(dtypeName(d)) + ": " + userMessage(e.what()));
      ok = false;
    }
  }
  out << "  caps:\n";
  if (!table.empty()) table.print(out, "    ");
  for (const auto& o : other) out << "    " << o << '\n';
  return ok;
}

bool showScheduler(std::ostream& out, const SchedulerPlugin& plugin, const Params& params) {
  printInfo(out, plugin.info(), params);
  try {
    const auto instance = plugin.instantiate(params);
    const uint64_t credit = instance->caps().credit_bytes;
    out << "  credit:       " << (credit ? std::to_string(credit) + " bytes in flight" : "unlimited") << '\n';
    return true;
  } catch (const std::exception& e) {
    out << "  caps:         not available: " << userMessage(e.what()) << '\n';
    if (params.empty()) out << "                (pass parameters with --param KEY=VALUE)\n";
    return params.empty() && dynamic_cast<const PluginError*>(&e) == nullptr;
  }
}

int showCommand(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("plugin-path", po::value<std::vector<std::string>>()->composing(),
                                                    "search DIR first (repeatable, DIR:DIR...)")(
      "param", po::value<std::vector<std::string>>()->composing(), "KEY=VALUE passed to the plugin (repeatable)")(
      "kind", po::value<std::string>(), "compressor or scheduler (default: whichever exists)")(
      "numel", po::value<std::string>(), "show a compressor's payload bytes for N f32 elements")(
      "shape", po::value<std::string>(), "the same for a shaped tensor, e.g. 300x257")(
      "world", po::value<int>(), "workers for the wire bytes of --numel/--shape (default 4)");
  po::options_description hidden;
  hidden.add_options()("plugin", po::value<std::string>(), "NAME|PATH");
  po::options_description all;
  all.add(options).add(hidden);
  po::positional_options_description positional;
  positional.add("plugin", 1);

  po::variables_map vm;
  Params params;
  std::vector<PluginKind> kinds = {PluginKind::kCompressor, PluginKind::kScheduler};
  std::optional<ConformanceShape> payload_shape;
  int world = kDefaultWorld;
  try {
    po::store(po::command_line_parser(args).options(all).positional(positional).run(), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << kShowUsage << "\n" << options;
      return kExitOk;
    }
    if (!vm.count("plugin")) throw po::error("missing NAME|PATH");
    if (vm.count("param")) params = parseParams(vm["param"].as<std::vector<std::string>>());
    try {
      payload_shape = shapeFromOptions(
          vm.count("numel") ? std::optional(parseUnsigned("--numel", vm["numel"].as<std::string>())) : std::nullopt,
          vm.count("shape") ? std::optional(vm["shape"].as<std::string>()) : std::nullopt);
    } catch (const std::invalid_argument& e) {
      throw po::error(e.what());
    }
    if (vm.count("world")) {
      if (!payload_shape) throw po::error("--world needs --numel or --shape (the tensor whose bytes it counts)");
      world = vm["world"].as<int>();
      if (world < 1) throw po::error("--world must be at least 1, got " + std::to_string(world));
    }
    if (vm.count("kind")) {
      const std::string k = vm["kind"].as<std::string>();
      if (k == "compressor") {
        kinds = {PluginKind::kCompressor};
      } else if (k == "scheduler") {
        kinds = {PluginKind::kScheduler};
      } else {
        throw po::error("--kind must be compressor or scheduler, got '" + k + "'");
      }
    }
  } catch (const po::error& e) {
    std::cerr << "terse plugins show: " << e.what() << "\n\n" << kShowUsage << "\n" << options;
    return kExitUsage;
  }
  const std::string target = vm["plugin"].as<std::string>();
  std::optional<PluginLoader> plugins = pluginLoader("plugins show", pluginPaths(vm));
  if (!plugins) return kExitUsage;
  PluginLoader& loader = *plugins;

  // Loads and prints one kind; false (with the error on stderr) when it failed.
  auto show = [&](PluginKind kind, bool& shown) {
    try {
      if (shown) std::cout << '\n';
      bool ok = false;
      if (kind == PluginKind::kCompressor) {
        const auto plugin = loader.loadCompressor(target);
        ok = showCompressor(std::cout, *plugin, params);
        if (payload_shape) ok = printPayloadSizes(std::cout, *plugin, params, *payload_shape, world) && ok;
      } else {
        ok = showScheduler(std::cout, *loader.loadScheduler(target), params);
      }
      shown = true;
      return ok;
    } catch (const std::exception& e) {
      std::cerr << "terse plugins show: " << userMessage(e.what()) << '\n';
      return false;
    }
  };

  bool shown = false;
  if (PluginLoader::isPathArgument(target)) {
    // A file is one plugin. Without --kind, a file named like a scheduler is tried as one, anything else as a
    // compressor; the load error names the other kind when the file is one.
    PluginKind kind = kinds.front();
    if (kinds.size() == 2 && std::filesystem::path(target).filename().string().rfind("terse_scheduler_", 0) == 0)
      kind = PluginKind::kScheduler;
    return show(kind, shown) ? kExitOk : kExitFailure;
  }

  // By name: every kind that has a file of that name (both, when a compressor and a scheduler share a name).
  std::vector<PluginKind> present;
  for (PluginKind kind : kinds) {
    for (const auto& d : loader.searchDirs()) {
      std::error_code ec;
      if (d.exists && isValidPluginName(target) &&
          std::filesystem::is_regular_file(d.dir / PluginLoader::fileNameFor(kind, target), ec)) {
        present.push_back(kind);
        break;
      }
    }
  }
  if (present.empty()) {
    // Its "not found" (or "not a valid name") error lists the directories searched.
    show(kinds.front(), shown);
    if (kinds.size() == 2 && isValidPluginName(target))
      std::cerr << "terse plugins show: no " << PluginLoader::fileNameFor(PluginKind::kScheduler, target)
                << " either\n";
    return kExitFailure;
  }
  bool ok = true;
  for (PluginKind kind : present) ok = show(kind, shown) && ok;
  return ok ? kExitOk : kExitFailure;
}

}  // namespace

int pluginsCommand(const std::vector<std::string>& args) {
  if (args.empty()) {
    std::cerr << kPluginsUsage;
    return kExitUsage;
  }
  const std::string& sub = args.front();
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  if (sub == "--help" || sub == "-h") {
    std::cout << kPluginsUsage;
    return kExitOk;
  }
  if (sub == "list") return listCommand(rest);
  if (sub == "show") return showCommand(rest);
  if (sub == "check") return checkCommand(rest);
  std::cerr << "terse plugins: '" << sub << "' is not a plugins subcommand\n\n" << kPluginsUsage;
  return kExitUsage;
}

}  // namespace terse::cli
