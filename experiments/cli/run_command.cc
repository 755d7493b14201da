// `terse run [CONFIG] [--variant NAME]... [--set PATH=VALUE]... [--grid PATH=V1,V2]... [--workers N] [--seeds LIST]
// [--out DIR] [--plugin-path P]...`: runs a study.
//
// The whole study is loaded and validated first (syntax, values, plugins instantiated with their parameters), so a
// broken config fails with FILE:LINE:COL before any variant trains. With --variant only the selected variants' plugins
// are loaded (experiments/config/config.h, ConfigOptions::plugin_variants): every field of every variant is still
// checked, but a variant naming a plugin this machine does not have no longer stops another from running. Then each
// selected variant runs in turn into
// <out>/<study>/<variant>/, and a small table compares them at the end. Without CONFIG the embedded quickstart runs.
// A failed variant does not stop the study, except that a variant whose workload the PyTorch driver refused (its
// module, model, data or device) or whose module failed before training (runner::WorkloadRefused) is not followed by
// the variants that share that workload.
//
// --set overrides one field of every variant, or of the selected ones (experiments/config/field_override.h), before
// the checks, so an override is checked as the file's values are, and the folder's config.textproto holds it. Under
// `terse launch` every rank runs this same command line, so every rank applies the same overrides to the same file.
// --grid adds an axis to the study's grid, or gives the file's axis of that field other values
// (experiments/config/grid.h): every selected variant then runs at every point.
//
// Stopped by SIGTERM, SIGHUP or SIGINT (a scheduler, a closed session, Ctrl-C), the process marks the folder of the
// variant in progress failed, naming the signal, starts no later variant and ends by that signal: a thread of
// core/common/stop_signals.h takes them from the start, so the variants' threads never do.
//
// Under `terse launch` the process tells the launcher how the study went (core/common/launch_notify.h): the rank that
// writes the results says `study-done` once every variant completed, and a rank that fails says `failed <reason>`
// before it exits non-zero. Not per variant: a multi-process study goes on to its next variant after one fails, and
// the launcher's clock must not start while ranks still train.
#include <algorithm>
#include <boost/program_options.hpp>
#include <charconv>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "core/common/launch_notify.h"
#include "core/common/stop_signals.h"
#include "core/plugin/loader.h"
#include "experiments/cli/cli_util.h"
#include "experiments/cli/commands.h"
#include "experiments/config/config.h"
#include "experiments/config/quickstart.h"
#include "experiments/runner/runner.h"
#include "results/result_writer.h"

namespace terse::cli {
namespace {

namespace po = boost::program_options;

constexpr std::string_view kUsage =
    "usage: terse run [CONFIG] [--variant NAME]... [--set PATH=VALUE]... [--grid PATH=V1,V2,...]... [--workers N]\n"
    "                 [--seeds LIST] [--out DIR] [--plugin-path DIR]... [--dry-run | --print-config]\n"
    "\n"
    "Runs every variant of the study in CONFIG (a .textproto; default: the embedded quickstart study) and writes\n"
    "results/<study>/<variant>/{config.textproto,provenance.json,metrics.jsonl,status.json}. The whole config is\n"
    "checked first; with --variant, only the selected variants' compressor and scheduler plugins must be found.\n"
    "\n"
    "--set PATH=VALUE sets one field of every variant (with --variant, of the selected ones), over the base's and\n"
    "the variant's value, before the checks:\n"
    "PATH is a dotted field path (experiments/configs/README.md), VALUE as the file would spell it (a string may be\n"
    "bare; a list is [a, b] and replaces the list; a map entry is PATH.KEY=VALUE), e.g.\n"
    "  terse run study.textproto --set epochs=1 --set optimizer.lr=0.05 --set compressor.params.ratio=0.01\n"
    "The results folder's config.textproto holds the overridden values.\n"
    "\n"
    "--grid PATH=V1,V2,... makes PATH an axis of the study's grid (or gives the config's axis of PATH these values):\n"
    "every variant runs once per point of the axes' product, into <variant>.<label>-<value>/, and terse compare\n"
    "gives each point its own table, e.g.\n"
    "  terse run study.textproto --grid link.bandwidth=1Gbps,10Gbps,100Gbps --grid workers=4,8\n"
    "\n"
    "--dry-run checks the study as a run would and lists the runs it would make, with their folders, writing nothing;\n"
    "--print-config also prints each run's resolved config (defaults, the variant's settings and --set applied).";

std::string fixed(double v, int digits) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(digits) << v;
  return s.str();
}

// "1,2,3" -> {1, 2, 3}; anything but non-negative integers separated by single commas is refused, naming the text.
std::vector<uint64_t> parseSeeds(const std::string& text) {
  std::vector<uint64_t> seeds;
  const char* p = text.data();
  const char* const end = p + text.size();
  for (;;) {
    uint64_t seed = 0;
    const auto [next, ec] = std::from_chars(p, end, seed);
    if (ec != std::errc() || (next != end && *next != ','))
      throw po::error("--seeds: '" + text + "' is not a comma-separated list of seeds (integers >= 0), e.g. 1,2,3");
    seeds.push_back(seed);
    if (next == end) return seeds;
    p = next + 1;
  }
}

}  // namespace

int runCommand(const std::vector<std::string>& args) {
  po::options_description options("options");
  options.add_options()("help,h", "show this help")("variant", po::value<std::vector<std::string>>()->composing(),
                                                    "run only this variant (repeatable)")(
      "set", po::value<std::vector<std::string>>()->composing(),
      "PATH=VALUE: set this field of every variant (with --variant: of those selected), e.g. epochs=1 (repeatable)")(
      "grid", po::value<std::vector<std::string>>()->composing(),
      "PATH=V1,V2,...: run every variant at each value of this field (an axis of the study's grid; repeatable)")(
      "workers", po::value<int>(), "override the number of workers of every variant (as --set workers=N)")(
      "seeds", po::value<std::string>(),
      "run every variant once per seed in LIST (e.g. 1,2,3), replacing the config's seeds and seed")(
      "out", po::value<std::string>(), "results root (default: the config's output_dir)")(
      "plugin-path", po::value<std::vector<std::string>>()->composing(), "search DIR first (repeatable, DIR:DIR...)")(
      "dry-run", "check the study and list the runs it would make and their folders; write nothing")(
      "print-config", "as --dry-run, and print each run's resolved config")(
      "config", po::value<std::vector<std::string>>(), "the study file");
  po::positional_options_description positional;
  positional.add("config", -1);
  po::variables_map vm;
  std::vector<uint64_t> seeds;
  try {
    po::store(po::command_line_parser(args).options(options).positional(positional).run(), vm);
    po::notify(vm);
    if (vm.count("config") && vm["config"].as<std::vector<std::string>>().size() > 1)
      throw po::error("give one CONFIG, got " + std::to_string(vm["config"].as<std::vector<std::string>>().size()));
    if (vm.count("seeds")) seeds = parseSeeds(vm["seeds"].as<std::string>());
    // A field given by both a flag and --set would take one of the two silently.
    if (vm.count("set")) {
      for (const auto& set : vm["set"].as<std::vector<std::string>>()) {
        const std::string path = set.substr(0, set.find('='));
        const char* flag = path == "workers"                   ? "--workers"
                           : path == "seeds" || path == "seed" ? "--seeds"
                           : path == "output_dir"              ? "--out"
                                                               : nullptr;
        if (flag != nullptr && vm.count(flag + 2))
          throw po::error("--set " + set + " and " + flag + " both set " + path + "; give one of them");
      }
    }
  } catch (const po::error& e) {
    std::cerr << "terse run: " << e.what() << "\n\n" << kUsage << "\n\n" << options;
    return kExitUsage;
  }
  if (vm.count("help")) {
    std::cout << kUsage << "\n\n" << options;
    return kExitOk;
  }
  // Before any thread of the run starts, so that every one of them inherits the blocked signals.
  stop::install([](int sig) {
    const std::string why = stop::describe(sig);
    std::string line = "terse run: " + why;
    for (const auto& dir : results::failStopped(why, stop::signalName(sig)))
      line += "; status failed in " + dir.string();
    std::cerr << line << '\n' << std::flush;
    notifyLauncher("failed " + why);
  });

  std::string plugin_path_error;
  std::optional<PluginLoader> plugins = pluginLoader(
      "run", vm.count("plugin-path") ? vm["plugin-path"].as<std::vector<std::string>>() : std::vector<std::string>{},
      &plugin_path_error);
  if (!plugins) {
    notifyLauncher("failed " + plugin_path_error);
    return kExitUsage;
  }
  PluginLoader& loader = *plugins;
  auto config_options = runner::runnerConfigOptions(&loader);
  // A pytorch workload's module is named relative to its config file (experiment.proto PyTorch.module): validation
  // looks for it there, and the loader gives the experiments its canonical path (config.h, module_dir).
  std::filesystem::path config_dir;
  if (vm.count("config")) {
    config_dir = std::filesystem::absolute(vm["config"].as<std::vector<std::string>>().front()).parent_path();
    config_options.module_dir = config_dir;
  }
  if (vm.count("variant")) config_options.plugin_variants = vm["variant"].as<std::vector<std::string>>();
  if (vm.count("grid")) config_options.grid = vm["grid"].as<std::vector<std::string>>();
  std::vector<experiments::Experiment> experiments;
  try {
    if (vm.count("set"))
      config_options.overrides = experiments::parseFieldOverrides(vm["set"].as<std::vector<std::string>>());
    // --workers N is --set workers=N: applied before the checks, it gets every check that depends on the number of
    // workers (ranks_per_node, a topology's hosts, worker_settings, link overrides), and its messages name --workers.
    // Re-checking a hand-picked few afterwards let a study through that its own config.textproto then failed.
    if (vm.count("workers")) {
      auto workers = experiments::parseFieldOverride("workers=" + std::to_string(vm["workers"].as<int>()), "--workers");
      workers.where = "--workers " + std::to_string(vm["workers"].as<int>());
      config_options.overrides.push_back(std::move(workers));
    }
    const experiments::Study study =
        vm.count("config")
            ? experiments::loadStudy(vm["config"].as<std::vector<std::string>>().front(), config_options)
            : experiments::loadStudyText(experiments::quickstartConfigText(),
                                         std::string(experiments::kQuickstartSourceName), config_options);
    experiments = experiments::selectVariants(
        study, vm.count("variant") ? vm["variant"].as<std::vector<std::string>>() : std::vector<std::string>{});
    if (!seeds.empty()) experiments::overrideSeeds(experiments, seeds);
    experiments = experiments::expandRepeats(experiments);
    for (const std::string& w : experiments::sameRunWarnings(experiments))
      std::cerr << "terse run: warning: " << w << '\n';
  } catch (const experiments::ConfigError& e) {
    for (const auto& line : e.errors()) std::cerr << "terse run: " << userMessage(line) << '\n';
    if (!e.errors().empty()) notifyLauncher("failed " + userMessage(e.errors().front()));
    return kExitFailure;
  } catch (const std::exception& e) {
    std::cerr << "terse run: " << userMessage(e.what()) << '\n';
    notifyLauncher("failed " + userMessage(e.what()));
    return kExitFailure;
  }

  if (vm.count("dry-run") || vm.count("print-config")) {
    // Everything above ran as for a real run (every field checked, the selected variants' plugins loaded with their
    // parameters), so a study that passes here fails later only for what only a run can find.
    Table plan({"run", "folder", "workers", "mode", "compressor", "epochs"});
    for (const auto& e : experiments) {
      const std::filesystem::path root =
          vm.count("out") ? std::filesystem::path(vm["out"].as<std::string>()) : std::filesystem::path(e.output_dir());
      std::string compressor = e.compressor().name();
      // Sorted (pluginParams): a protobuf map's order is unspecified, and two seeds' copies of one variant listed a
      // compressor's parameters in two orders.
      for (const auto& [key, value] : experiments::pluginParams(e.compressor())) compressor += " " + key + "=" + value;
      if (e.error_feedback()) compressor += " +" + experiments::errorFeedbackRuleLabel(e);
      if (e.compression_start_step() > 0) compressor += " from step " + std::to_string(e.compression_start_step());
      const std::string folder = (root / e.study() / experiments::resultsSubfolder(e)).string();
      // What changes how a mode communicates or what each worker sees, so that variants that differ there show it.
      std::string mode = experiments::Experiment::Mode_Name(e.mode());
      if (const auto& l = e.local_sgd(); l.period() > 0) {
        mode += " local-sgd/" + std::to_string(l.period());
        if (l.start_step() > 0) mode += " from " + std::to_string(l.start_step());
        if (l.outer_lr() != 1 || l.outer_momentum() != 0) mode += " +outer";
        if (l.qsr_alpha() > 0) {
          std::ostringstream alpha;
          alpha << l.qsr_alpha();
          mode += " qsr-" + alpha.str();
        }
      }
      if (e.data().partition() == experiments::Data::DIRICHLET) {
        std::ostringstream alpha;
        alpha << e.data().dirichlet_alpha();
        mode += " dirichlet-" + alpha.str();
      }
      plan.add({e.variant() + (e.seeds_size() > 0 ? " (seed " + std::to_string(e.seed()) + ")" : ""), folder,
                std::to_string(e.workers()), mode, compressor, std::to_string(e.epochs())});
      if (vm.count("print-config"))
        std::cout << "# " << folder << "/config.textproto\n" << experiments::toText(e) << '\n';
    }
    plan.print(std::cout);
    std::cout << experiments.size() << (experiments.size() == 1 ? " run" : " runs")
              << " checked; nothing was run or written (--dry-run)\n";
    return kExitOk;
  }

  runner::RunnerOptions ro;
  ro.loader = &loader;
  if (vm.count("out")) ro.output_root = vm["out"].as<std::string>();
  ro.terse_version = TERSE_VERSION;
  runner::Runner run(ro);
  Table table({"variant", "final acc", "best acc", "wire MB/worker", "payload MB/worker", "time"});
  int failed = 0;
  std::string first_error;
  // Variants whose workload the driver refused (runner::WorkloadRefused), with the reason: a later variant training
  // the same one is skipped, not started to fail alike; its folder says so (Runner::skip).
  std::vector<std::pair<const experiments::Experiment*, std::string>> refused;
  for (const auto& experiment : experiments) {
    stop::parkIfStopping();  // a stop recorded during the last variant: this one must not start
    const auto same = std::find_if(refused.begin(), refused.end(),
                                   [&](const auto& r) { return runner::sameWorkloadAsRefused(experiment, *r.first); });
    if (same != refused.end()) {
      const std::string why = "skipped: it has the workload, data and workers of variant '" + same->first->variant() +
                              "', which failed before training";
      std::cerr << "terse run: variant '" << experiment.variant() << "' " << why << " (above)\n";
      try {
        run.skip(experiment, why + ": " + same->second);
      } catch (const std::exception& e) {
        std::cerr << "terse run: " << userMessage(e.what()) << '\n';
      }
      if (run.primary()) table.add({experiment.variant(), "skipped", "-", "-", "-", "-"});
      ++failed;
      continue;
    }
    try {
      const runner::RunSummary s = run.run(experiment);
      if (!run.primary()) continue;  // ranks 1.. of a multi-process run: rank 0 reports for the job
      table.add({s.variant + (experiment.seeds_size() > 0 ? " (seed " + std::to_string(experiment.seed()) + ")" : ""),
                 fixed(s.final_accuracy, 4), fixed(s.best_accuracy, 4),
                 fixed(static_cast<double>(s.wire_bytes_per_worker) / 1e6, 2),
                 fixed(static_cast<double>(s.payload_bytes_per_worker) / 1e6, 2),
                 // Three significant figures below 100 s: a simulated 100 Gbps step is milliseconds.
                 fixed(s.wall_s, s.wall_s < 1    ? 3
                                 : s.wall_s < 10 ? 2
                                                 : 1) +
                     (s.simulated ? " s (sim)" : " s")});
      std::cerr << "terse run: " << s.variant << " done: " << s.dir.string() << '\n';
    } catch (const std::exception& e) {
      std::cerr << "terse run: " << userMessage(e.what()) << '\n';
      if (run.primary()) table.add({experiment.variant(), "failed", "-", "-", "-", "-"});
      if (failed++ == 0) first_error = userMessage(e.what());
      if (dynamic_cast<const runner::WorkloadRefused*>(&e) != nullptr)
        refused.emplace_back(&experiment, userMessage(e.what()));
    }
  }
  stop::parkIfStopping();  // the stopping thread ends the process, by its signal
  if (!experiments.empty() && run.primary()) {
    std::cout << '\n';
    table.print(std::cout);
  }
  if (failed > 0) {
    notifyLauncher(experiments.size() == 1
                       ? "failed " + first_error
                       : "failed " + std::to_string(failed) + " of " + std::to_string(experiments.size()) +
                             " variants failed; the first: " + first_error);
    return kExitFailure;
  }
  // Before this process's teardown, which a launcher that waits for exits alone would have to wait for.
  if (run.primary()) notifyLauncher("study-done");
  return kExitOk;
}

}  // namespace terse::cli
